"""Connecting a workspace's cloud accounts: AWS (a role or access keys),
Kubernetes (a kubeconfig, or the server's own service account where the
operator allows it), validating them for real, and removing them.

Nothing is saved for an account whose checks fail (``backends/aws/checks.py``,
``backends/kubernetes/checks.py``);
credentials are encrypted (``backend.vault.crypto``) and never returned or
logged. Checks make network calls, so they run outside any transaction.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from backend.accounts.models import User, Workspace
from backend.clouds.backends.aws.checks import CheckTarget, check_account
from backend.clouds.backends.aws.policy import INSTALLATION_TAG, permission_policy, trust_policy
from backend.clouds.backends.aws.session import auth_of
from backend.clouds.backends.base import AccountConfig
from backend.clouds.backends.errors import ComputeError
from backend.clouds.backends.registry import compute_for
from backend.clouds.models import (
    LIVE_STATUSES,
    AccountStatus,
    AwsExternalId,
    BackendKind,
    CloudAccount,
    Instance,
    InstanceStatus,
    Volume,
    VolumeStatus,
)
from backend.clouds.services.accounts import (
    LOCAL_ACCOUNT_NAME,
    account_config,
    account_mark_broken,
    installation,
    kubernetes_server_config,
)
from backend.core.enqueue import enqueue
from backend.core.errors import ApplicationError
from backend.vault.crypto import encrypt

if TYPE_CHECKING:
    from backend.clouds.backends.kubernetes.checks import ClusterCheck

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "trainyard/"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-\d$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_AMI = re.compile(r"^ami-[0-9a-f]{8,17}$")


@dataclass(frozen=True)
class AwsSetup:
    """What a user needs before creating the role: shown by the setup endpoint."""

    external_id: str
    principal: str  # the server's AWS principal ("" when TRAINYARD_AWS_PRINCIPAL_ARN is unset)
    installation: str
    prefix: str
    trust_policy: dict[str, Any]
    permission_policy: dict[str, Any]


def aws_external_id(*, workspace: Workspace) -> str:
    """The workspace's external id, generated once (race-safe: two first
    calls at once both return the one row that won)."""
    found = AwsExternalId.objects.filter(workspace=workspace).values_list("value", flat=True).first()
    if found:
        return str(found)
    try:
        with transaction.atomic():
            return str(AwsExternalId.objects.create(workspace=workspace, value=_new_external_id()).value)
    except IntegrityError:
        return str(AwsExternalId.objects.get(workspace=workspace).value)


def aws_setup(*, workspace: Workspace, bucket: str = "", data_bucket: str = "", output_bucket: str = "") -> AwsSetup:
    """The external id, the trust policy naming the server's principal, and
    the permission policy for ``bucket`` (``${BucketName}`` when not given),
    with the statements of the named ``data_bucket`` (read by ``inputs:``)
    and ``output_bucket`` (written by ``to:``) when given."""
    external_id = aws_external_id(workspace=workspace)
    principal = settings.TRAINYARD["AWS_PRINCIPAL_ARN"]
    return AwsSetup(
        external_id=external_id,
        principal=principal,
        installation=installation(),
        prefix=DEFAULT_PREFIX,
        trust_policy=trust_policy(principal=principal or "${TrustedPrincipalArn}", external_id=external_id),
        permission_policy=permission_policy(
            bucket=bucket or "${BucketName}",
            prefix=DEFAULT_PREFIX,
            installation=installation(),
            data_bucket=data_bucket,
            output_bucket=output_bucket,
        ),
    )


def aws_connect(
    *,
    workspace: Workspace,
    user: User,
    name: str = "aws",
    role_arn: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    regions: Sequence[str],
    bucket: str,
    subnets: Mapping[str, Sequence[str]] | None = None,
    amis: Mapping[str, str] | None = None,
    gpu_amis: Mapping[str, str] | None = None,
) -> CloudAccount:
    """1. Check the input (one way in, regions, bucket, ids). 2. Run every
    check against AWS (outside any transaction). 3. Only then save the
    account, active, credentials encrypted. Any failure raises
    ``ApplicationError`` with one precise message and saves nothing."""
    _check_name(workspace, name)
    config = _aws_config(
        workspace, role_arn=role_arn, keys=bool(access_key_id or secret_access_key), regions=regions, bucket=bucket
    )
    config.update(_placement(regions, subnets or {}, amis or {}, gpu_amis or {}))
    credentials = _keys(access_key_id, secret_access_key) if not role_arn else {}
    identity = _run_checks(_config_of(workspace, config, credentials))
    config["aws_account_id"] = identity
    account = _account_create(workspace, BackendKind.AWS, name, config, credentials)
    logger.info("workspace %s connected aws account %s as %r (by %s)", workspace.slug, identity, name, user.username)
    # The new account's facts (zones, offerings) for its first offers; the
    # periodic refresh would get them within a minute anyway.
    enqueue("backend.clouds.tasks.facts_refresh", str(account.pk))
    return account


def aws_validate(*, account: CloudAccount) -> CloudAccount:
    """Run the checks again: active on success, ``broken`` with the reason
    on failure (then ``ApplicationError`` with that reason)."""
    if account.kind != BackendKind.AWS:
        raise ApplicationError(f"Backend {account.name!r} is {account.kind}: only aws backends are validated.")
    try:
        _run_checks(account_config(account))
    except ApplicationError as error:
        account_mark_broken(account_id=str(account.pk), message=error.message)
        raise
    CloudAccount.objects.filter(pk=account.pk).update(
        status=AccountStatus.ACTIVE, status_reason="", validated_at=timezone.now(), updated_at=timezone.now()
    )
    account.refresh_from_db()
    return account


# A kubeconfig is a tenant's text the server parses: bounded.
MAX_KUBECONFIG_BYTES = 64 * 1024
# The configuration keys a user sets on a Kubernetes backend (the server sets
# ``facts``, ``allowed_networks`` and ``in_cluster_allowed``).
KUBERNETES_KEYS = (
    "namespace",
    "context",
    "cluster",
    "in_cluster",
    "image",
    "image_pull_secrets",
    "node_selector",
    "tolerations",
    "prices",
    "spot_prices",
    "default_price",
    "node_pools",
    "schedule_timeout_seconds",
    "termination_grace_seconds",
    "gpu_resource",
)


def kubernetes_connect(
    *,
    workspace: Workspace,
    user: User,
    name: str = "kubernetes",
    kubeconfig: str = "",
    in_cluster: bool = False,
    namespace: str,
    **options: Any,
) -> CloudAccount:
    """1. Check the input (one way in, the kubeconfig's size). 2. Check the
    cluster for real (``check_cluster``: the API server, the namespace, every
    permission the backend uses, the GPU resources) and list its nodes
    (``refresh_facts``), outside any transaction. 3. Only then save the
    account, active, the kubeconfig encrypted, the nodes as its facts. Any
    failure raises ``ApplicationError`` with one precise message and saves
    nothing. ``options``: the other ``KUBERNETES_KEYS``; None or empty is unset."""
    _check_name(workspace, name)
    unknown = sorted(set(options) - set(KUBERNETES_KEYS))
    if unknown:
        raise ApplicationError(f"unknown kubernetes option(s): {', '.join(unknown)}", extra={"field": unknown[0]})
    if in_cluster and kubeconfig:
        raise ApplicationError("give a kubeconfig or in_cluster, not both", extra={"field": "kubeconfig"})
    if not in_cluster and not kubeconfig.strip():
        raise ApplicationError(
            "connect Kubernetes with a kubeconfig whose user is a service account bound to "
            "deploy/kubernetes/backend-rbac.yaml (docs/BACKENDS.md, Kubernetes)",
            extra={"field": "kubeconfig"},
        )
    if in_cluster and not settings.TRAINYARD["KUBERNETES_IN_CLUSTER"]:
        raise ApplicationError(
            "in_cluster: this server does not let backends use its own service account "
            "(the operator sets TRAINYARD_KUBERNETES_IN_CLUSTER=true); connect with a kubeconfig",
            extra={"field": "in_cluster"},
        )
    if len(kubeconfig.encode()) > MAX_KUBECONFIG_BYTES:
        raise ApplicationError(
            f"the kubeconfig is larger than {MAX_KUBECONFIG_BYTES // 1024} KiB: give one with only the "
            "context Trainyard uses (kubectl config view --minify --flatten)",
            extra={"field": "kubeconfig"},
        )
    config: dict[str, Any] = {"namespace": namespace}
    config.update({k: v for k, v in options.items() if v is not None and v != "" and v != [] and v != {}})
    if in_cluster:
        config["in_cluster"] = True
    credentials = {"kubeconfig": kubeconfig} if kubeconfig else {}
    checked = _kube_checks(_kube_config_of(workspace, config, credentials))
    config["facts"] = checked.facts
    config["cluster"] = checked.cluster  # the offers' region, shown with the backend
    account = _account_create(workspace, BackendKind.KUBERNETES, name, config, credentials)
    logger.info(
        "workspace %s connected kubernetes namespace %s (server %s, %d nodes) as %r (by %s)",
        workspace.slug,
        checked.check.namespace,
        checked.check.server_version,
        checked.check.nodes,
        name,
        user.username,
    )
    return account


def backend_validate(*, account: CloudAccount) -> CloudAccount:
    """Run the account's checks again (its kind's): active on success (a
    Kubernetes account's nodes stored again), ``broken`` with the reason on
    failure (then ``ApplicationError`` with that reason)."""
    if account.kind == BackendKind.AWS:
        return aws_validate(account=account)
    if account.kind != BackendKind.KUBERNETES:
        raise ApplicationError(
            f"Backend {account.name!r} is {account.kind}: only aws and kubernetes backends are validated."
        )
    try:
        facts = _kube_checks(account_config(account)).facts
    except ApplicationError as error:
        account_mark_broken(account_id=str(account.pk), message=error.message)
        raise
    with transaction.atomic():
        locked = CloudAccount.objects.select_for_update().filter(pk=account.pk)
        current = locked.values_list("config", flat=True).first()
        CloudAccount.objects.filter(pk=account.pk).update(
            config={**(current or {}), "facts": facts},
            status=AccountStatus.ACTIVE,
            status_reason="",
            validated_at=timezone.now(),
            updated_at=timezone.now(),
        )
    account.refresh_from_db()
    return account


def backend_remove(*, account: CloudAccount) -> None:
    """Delete the account; refused while it has live or terminating
    instances (their machines would be nobody's). The account row is locked
    so that a launch cannot slip in between the check and the delete."""
    if account.kind == BackendKind.LOCAL and account.name == LOCAL_ACCOUNT_NAME:
        raise ApplicationError(
            "The local backend belongs to the server: it cannot be removed "
            "(TRAINYARD_LOCAL_BACKEND=false turns it off)."
        )
    with transaction.atomic():
        CloudAccount.objects.select_for_update().filter(pk=account.pk).first()
        live = list(
            Instance.objects.filter(account=account, status__in=[*LIVE_STATUSES, InstanceStatus.TERMINATING])
            .order_by("created_at")
            .values_list("name", "status")
        )
        if live:
            shown = ", ".join(f"{n} ({s})" for n, s in live[:10]) + (" …" if len(live) > 10 else "")
            raise ApplicationError(
                f"Backend {account.name!r} still has {len(live)} live instance(s): {shown}. "
                "Stop their runs (or wait for them to be terminated), then remove it.",
                extra={"instances": [n for n, _ in live]},
                status_code=409,
            )
        kept = list(
            Volume.objects.filter(account=account)
            .exclude(status=VolumeStatus.DELETED)
            .order_by("name")
            .values_list("name", flat=True)
        )
        if kept:
            raise ApplicationError(
                f"Backend {account.name!r} still has {len(kept)} volume(s): {', '.join(kept[:10])}. "
                "Delete them first (trainyard volume delete NAME): their data would be nobody's.",
                extra={"volumes": kept},
                status_code=409,
            )
        # Ended instances and deleted volumes keep their history without the account.
        Instance.objects.filter(account=account).update(account=None)
        Volume.objects.filter(account=account).update(account=None)
        CloudAccount.objects.filter(pk=account.pk).delete()


# ------------------------------------------------------------------ helpers


def _account_create(
    workspace: Workspace, kind: BackendKind, name: str, config: dict[str, Any], credentials: Mapping[str, str]
) -> CloudAccount:
    """The checked account, saved active with its credentials encrypted; 409 when the name is taken."""
    try:
        with transaction.atomic():
            account: CloudAccount = CloudAccount.objects.create(
                workspace=workspace,
                kind=kind,
                name=name,
                config=config,
                credentials_ciphertext=encrypt(json.dumps(credentials)) if credentials else b"",
                status=AccountStatus.ACTIVE,
                validated_at=timezone.now(),
            )
    except IntegrityError:
        raise ApplicationError(f"A backend named {name!r} already exists in this workspace.", status_code=409) from None
    return account


def _new_external_id() -> str:
    return "trainyard-" + secrets.token_hex(16)


def _check_name(workspace: Workspace, name: str) -> None:
    if not _NAME.match(name):
        raise ApplicationError(
            f"backend name {name!r}: use lowercase letters, digits and dashes (at most 63), e.g. aws or aws-eu",
            extra={"field": "name"},
        )
    if name == LOCAL_ACCOUNT_NAME:
        raise ApplicationError("backend name 'local' is the server's own local backend: pick another name")
    if CloudAccount.objects.filter(workspace=workspace, name=name).exists():
        raise ApplicationError(
            f"A backend named {name!r} already exists in this workspace: remove it first "
            f"(trainyard backend rm {name}) or pick another --name.",
            status_code=409,
        )


def _aws_config(
    workspace: Workspace, *, role_arn: str | None, keys: bool, regions: Sequence[str], bucket: str
) -> dict[str, Any]:
    if role_arn and keys:
        raise ApplicationError("give either a role ARN or access keys, not both", extra={"field": "role_arn"})
    if not role_arn and not keys:
        raise ApplicationError(
            "connect AWS with a role (role_arn; see GET …/backends/aws/setup) or with access keys "
            "(access_key_id and secret_access_key)",
            extra={"field": "role_arn"},
        )
    if role_arn and not _ROLE_ARN.match(role_arn):
        raise ApplicationError(
            f"role_arn {role_arn!r} is not an IAM role ARN (arn:aws:iam::123456789012:role/trainyard)",
            extra={"field": "role_arn"},
        )
    if not regions:
        raise ApplicationError("name at least one region (e.g. us-east-1)", extra={"field": "regions"})
    bad = [r for r in regions if not _REGION.match(r)]
    if bad:
        raise ApplicationError(f"not an AWS region: {', '.join(bad)} (e.g. us-east-1)", extra={"field": "regions"})
    if not _BUCKET.match(bucket or ""):
        raise ApplicationError(
            f"bucket {bucket!r} is not an S3 bucket name (3–63 lowercase letters, digits, dots, dashes)",
            extra={"field": "bucket"},
        )
    config: dict[str, Any] = {"regions": list(dict.fromkeys(regions)), "bucket": bucket, "prefix": DEFAULT_PREFIX}
    if role_arn:
        config.update(role_arn=role_arn, external_id=aws_external_id(workspace=workspace))
    return config


def _placement(
    regions: Sequence[str],
    subnets: Mapping[str, Sequence[str]],
    amis: Mapping[str, str],
    gpu_amis: Mapping[str, str],
) -> dict[str, Any]:
    for what, mapping in (("subnets", subnets), ("amis", amis), ("gpu_amis", gpu_amis)):
        stray = [r for r in mapping if r not in regions]
        if stray:
            raise ApplicationError(
                f"{what} names region {', '.join(stray)}, which is not in regions ({', '.join(regions)})",
                extra={"field": what},
            )
    for region, ids in subnets.items():
        bad = [s for s in ids if not _SUBNET.match(s)]
        if bad or not ids:
            raise ApplicationError(
                f"subnets of {region}: {', '.join(bad) or 'none given'} (expected subnet-0123abcd…)",
                extra={"field": "subnets"},
            )
    for what, mapping in (("amis", amis), ("gpu_amis", gpu_amis)):
        bad = [f"{r}={a}" for r, a in mapping.items() if not _AMI.match(a)]
        if bad:
            raise ApplicationError(f"{what}: {', '.join(bad)} (expected ami-0123abcd…)", extra={"field": what})
    placement: dict[str, Any] = {}
    if subnets:
        placement["subnets"] = {r: list(ids) for r, ids in subnets.items()}
    if amis:
        placement["amis"] = dict(amis)
    if gpu_amis:
        placement["gpu_amis"] = dict(gpu_amis)
    return placement


def _keys(access_key_id: str | None, secret_access_key: str | None) -> dict[str, str]:
    if not access_key_id or not secret_access_key:
        missing = "access_key_id" if not access_key_id else "secret_access_key"
        raise ApplicationError(f"access keys need both access_key_id and secret_access_key; {missing} is missing")
    return {"access_key_id": access_key_id.strip(), "secret_access_key": secret_access_key.strip()}


def _config_of(workspace: Workspace, config: Mapping[str, Any], credentials: Mapping[str, str]) -> AccountConfig:
    return AccountConfig(
        account_id="",
        workspace_id=str(workspace.pk),
        kind=BackendKind.AWS,
        installation=installation(),
        config=dict(config),
        credentials=dict(credentials),
    )


def _run_checks(account: AccountConfig) -> str:
    """The AWS account id, or ``ApplicationError`` with the check's message."""
    config = account.config
    try:
        target = CheckTarget(
            auth=auth_of(account),
            regions=tuple(_strings(config.get("regions"))),
            bucket=str(config.get("bucket", "")),
            prefix=str(config.get("prefix", DEFAULT_PREFIX)),
            subnets=_mapping(config.get("subnets")),
            amis=_mapping(config.get("amis")),
            tags={INSTALLATION_TAG: account.installation, "trainyard:workspace": account.workspace_id},
        )
        return check_account(target).account
    except ComputeError as error:
        raise ApplicationError(error.message, extra={"code": error.code}) from None


def _kube_config_of(workspace: Workspace, config: Mapping[str, Any], credentials: Mapping[str, str]) -> AccountConfig:
    return AccountConfig(
        account_id="",
        workspace_id=str(workspace.pk),
        kind=BackendKind.KUBERNETES,
        installation=installation(),
        config={**config, **kubernetes_server_config()},
        credentials=dict(credentials),
    )


@dataclass(frozen=True)
class KubeChecked:
    """A cluster that passed its checks: what they found, its nodes (the
    facts its offers come from) and its name (the offers' region)."""

    check: ClusterCheck
    facts: dict[str, Any]
    cluster: str


def _kube_checks(account: AccountConfig) -> KubeChecked:
    """Check the cluster and list its nodes, or ``ApplicationError`` with the
    check's message. The backend's modules are loaded here, when a
    Kubernetes account is first checked."""
    from backend.clouds.backends.kubernetes.checks import check_cluster
    from backend.clouds.backends.kubernetes.compute import KubernetesCompute

    try:
        check = check_cluster(account)
        compute = compute_for(account)
        facts = dict(compute.refresh_facts() or {})
    except ComputeError as error:
        raise ApplicationError(error.message, extra={"code": error.code}) from None
    facts["refreshed_at"] = facts.get("refreshed_at") or timezone.now().timestamp()
    cluster = compute.options.cluster if isinstance(compute, KubernetesCompute) else ""
    return KubeChecked(check=check, facts=facts, cluster=cluster)


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list | tuple) else []


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}

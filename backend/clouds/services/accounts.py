"""Connected accounts and the backend built for each (``registry``)."""

from __future__ import annotations

import hashlib
import json
import logging
import shlex
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from django.conf import settings

from backend.clouds.backends.base import AccountConfig, Compute
from backend.clouds.backends.registry import KINDS, compute_class, compute_for
from backend.clouds.models import AccountStatus, BackendKind, CloudAccount
from backend.vault.crypto import decrypt

logger = logging.getLogger(__name__)

LOCAL_ACCOUNT_NAME = "local"

# Account id → (the account's updated_at, its backend): an edit or a facts refresh replaces it.
_computes: dict[str, tuple[str, Compute]] = {}


def accounts_usable(*, workspace_id: UUID | str) -> list[CloudAccount]:
    """The workspace's active accounts; the shared ``local`` one when the
    local backend is enabled on this server."""
    if settings.TRAINYARD["LOCAL_BACKEND_ENABLED"]:
        CloudAccount.objects.get_or_create(
            workspace_id=workspace_id, name=LOCAL_ACCOUNT_NAME, defaults={"kind": BackendKind.LOCAL}
        )
    accounts = CloudAccount.objects.filter(workspace_id=workspace_id, status=AccountStatus.ACTIVE).order_by(
        "created_at"
    )
    return [a for a in accounts if a.kind != BackendKind.LOCAL or settings.TRAINYARD["LOCAL_BACKEND_ENABLED"]]


def accounts_broken(*, workspace_id: UUID | str, kinds: Iterable[str] = ()) -> list[CloudAccount]:
    """The workspace's accounts marked broken (``account_mark_broken``), of ``kinds`` when given."""
    accounts = CloudAccount.objects.filter(workspace_id=workspace_id, status=AccountStatus.BROKEN)
    wanted = set(kinds)
    return [a for a in accounts.order_by("created_at") if not wanted or a.kind in wanted]


def compute_of(account: CloudAccount) -> Compute:
    """The backend for ``account``, built once per process and configuration
    (a facts refresh is a new configuration: the account's ``updated_at``)."""
    version = account.updated_at.isoformat() if account.updated_at else ""
    kept = _computes.get(str(account.pk))
    if kept is not None and kept[0] == version:
        return kept[1]
    compute = compute_for(account_config(account), settings.TRAINYARD["BACKEND_KINDS"])
    _computes[str(account.pk)] = (version, compute)
    return compute


def backends_warm() -> None:
    """Every backend kind's ``Compute.warm`` (built-in and
    ``TRAINYARD_BACKEND_KINDS``), when ``TRAINYARD_WARM_BACKENDS`` is on:
    the Celery worker's parent, before it forks its pool. A kind that fails
    to warm is logged and skipped: its first call pays instead."""
    if not settings.TRAINYARD["WARM_BACKENDS"]:
        return
    extra = settings.TRAINYARD["BACKEND_KINDS"]
    for kind in sorted({*KINDS, *extra}):
        try:
            compute_class(kind, extra).warm()
        except Exception:
            logger.exception("warming the %s backend failed", kind)


def account_config(account: CloudAccount) -> AccountConfig:
    config: dict[str, Any] = dict(account.config or {})
    if account.kind == BackendKind.LOCAL:
        config = {**local_config(), **config}
    if account.kind == BackendKind.KUBERNETES:
        config = {**config, **kubernetes_server_config()}
    credentials = json.loads(decrypt(bytes(account.credentials_ciphertext))) if account.credentials_ciphertext else {}
    return AccountConfig(
        account_id=str(account.pk),
        workspace_id=str(account.workspace_id),
        kind=account.kind,
        installation=installation(),
        config=config,
        credentials=credentials,
    )


def local_config() -> dict[str, Any]:
    trainyard = settings.TRAINYARD
    config: dict[str, Any] = {"runners_dir": str(settings.DATA_DIR / "local-runners")}
    if trainyard["LOCAL_RUNNER_COMMAND"]:
        config["runner_command"] = shlex.split(trainyard["LOCAL_RUNNER_COMMAND"])
    if trainyard["LOCAL_SHAPES"]:
        config["shapes"] = trainyard["LOCAL_SHAPES"]
    return config


def kubernetes_server_config() -> dict[str, Any]:
    """What the operator decides for every Kubernetes account, over anything
    stored: the private networks its API server may lie in
    (``TRAINYARD_KUBERNETES_PRIVATE_NETWORKS``; else public addresses only)
    and whether it may use the server's own service account
    (``TRAINYARD_KUBERNETES_IN_CLUSTER``)."""
    trainyard = settings.TRAINYARD
    return {
        "allowed_networks": list(trainyard["KUBERNETES_PRIVATE_NETWORKS"]),
        "in_cluster_allowed": bool(trainyard["KUBERNETES_IN_CLUSTER"]),
    }


def installation() -> str:
    """Tags every machine this server starts, so the leak sweep knows ours."""
    explicit = settings.TRAINYARD["INSTALLATION"]
    return explicit or "ty-" + hashlib.sha256(str(settings.DATA_DIR).encode()).hexdigest()[:12]


def account_mark_broken(*, account_id: str, message: str) -> None:
    """Credentials or configuration were refused: not used until fixed
    (``trainyard backend validate`` makes it active again)."""
    changed = (
        CloudAccount.objects.filter(pk=account_id)
        .exclude(status=AccountStatus.BROKEN, status_reason=message[:1000])
        .update(status=AccountStatus.BROKEN, status_reason=message[:1000])
    )
    if changed:
        logger.warning("cloud account %s is broken: %s", account_id, message)

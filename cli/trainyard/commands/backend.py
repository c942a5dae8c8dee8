"""``trainyard backend``: the cloud accounts a workspace runs machines in.
Connecting one checks it for real on the server first; credentials go up
once and are never shown back."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from ..api import ApiError, AwsSetup
from ..output import age, truncate
from . import common, options


@click.group(cls=common.Group)
def backend() -> None:
    """Cloud accounts the workspace runs machines in (docs/AWS.md, docs/BACKENDS.md in the Trainyard repository)."""


@backend.group("add", cls=common.Group)
def backend_add() -> None:
    """Connect a cloud account; the server checks it for real before saving it."""


@backend_add.command("aws")
@click.option("--name", default="aws", show_default=True, help="The backend's name in this workspace.")
@click.option("--role-arn", default=None, help="The IAM role Trainyard assumes (recommended; see `backend setup aws`).")
@click.option("--access-key-id", default=None, help="An IAM user's access key id (instead of a role).")
@click.option(
    "--secret-access-key",
    default=None,
    help="Its secret; else $AWS_SECRET_ACCESS_KEY, else a hidden prompt (or stdin when piped).",
)
@click.option("--regions", required=True, help="Comma-separated regions, e.g. us-east-1,eu-west-1.")
@click.option("--bucket", required=True, help="The S3 bucket for artifacts and checkpoints.")
@click.option("--subnet", "subnets", multiple=True, metavar="REGION=SUBNET", help="Use this subnet (repeatable).")
@click.option("--ami", "amis", multiple=True, metavar="REGION=AMI", help="The image for CPU machines (repeatable).")
@click.option("--gpu-ami", "gpu_amis", multiple=True, metavar="REGION=AMI", help="The image for GPU machines.")
def backend_add_aws(
    name: str,
    role_arn: str | None,
    access_key_id: str | None,
    secret_access_key: str | None,
    regions: str,
    bucket: str,
    subnets: tuple[str, ...],
    amis: tuple[str, ...],
    gpu_amis: tuple[str, ...],
) -> None:
    """Connect an AWS account with a role (the server assumes it with your
    workspace's external id) or with an IAM user's access keys."""
    if role_arn and access_key_id:
        raise click.UsageError("give either --role-arn or --access-key-id, not both")
    if not role_arn and not access_key_id:
        raise click.UsageError("give --role-arn (recommended) or --access-key-id and its secret")
    api = common.client()
    body: dict[str, Any] = {"kind": "aws", "name": name, "regions": options.split_values([regions]), "bucket": bucket}
    body.update(_per_region(subnets, amis, gpu_amis))
    setup = None
    if role_arn:
        setup = api.aws_setup(bucket=bucket)
        _show_setup(setup, role_arn=role_arn)
        body["role_arn"] = role_arn
    else:
        body["access_key_id"] = access_key_id
        body["secret_access_key"] = secret_access_key or _aws_secret()
    click.echo(f"Checking the account in {', '.join(body['regions'])} …", err=True)
    try:
        added = api.add_backend(body)
    except ApiError as e:
        if setup is not None and "could not assume role" in e.message:
            raise common.CliError(
                e.message,
                [
                    f"The role's trust policy must allow {setup['principal'] or 'the server'} to sts:AssumeRole "
                    f"with sts:ExternalId = {setup['external_id']} (shown above); fix it, then run this again."
                ],
            ) from None
        raise
    account = f" (AWS account {added['aws_account_id']})" if added.get("aws_account_id") else ""
    click.echo(f"Connected backend {added['name']}{account}: {added['status']}", err=True)


@backend_add.command("kubernetes")
@click.option("--name", default="kubernetes", show_default=True, help="The backend's name in this workspace.")
@click.option(
    "--kubeconfig",
    "kubeconfig_file",
    type=click.File("r"),
    default=None,
    help="The kubeconfig file (a service account token inline; `-`: stdin). Sent once, encrypted on the server.",
)
@click.option("--in-cluster", is_flag=True, help="Use the server's own service account (where its operator allows it).")
@click.option("--namespace", required=True, help="The namespace Trainyard runs its pods in.")
@click.option("--context", default="", help="The kubeconfig's context (default: its current-context).")
@click.option("--cluster", default="", help="The cluster's name in offers, as their region (default: the context's).")
@click.option("--image", default="", help="The pods' image (default: python:3.12-slim; the runner is installed in it).")
@click.option("--image-pull-secret", "pull_secrets", multiple=True, metavar="SECRET", help="Pull the image with it.")
@click.option("--price", "prices", multiple=True, metavar="TYPE=USD", help="An instance type's price an hour.")
@click.option("--spot-price", "spot_prices", multiple=True, metavar="TYPE=USD", help="Its price on spot nodes.")
@click.option("--default-price", type=float, default=None, help="USD an hour for types with no --price (default 0).")
@click.option("--node-selector", "selectors", multiple=True, metavar="LABEL=VALUE", help="A node label (repeatable).")
@click.option(
    "--toleration",
    "tolerations",
    multiple=True,
    metavar="KEY[=VALUE]:EFFECT",
    help="A taint every pod tolerates (repeatable), e.g. dedicated=ml:NoSchedule.",
)
@click.option("--node-pools", "pools_file", type=click.File("r"), default=None, help="A JSON list of node pools.")
@click.option("--schedule-timeout", type=float, default=None, help="Seconds a pod may wait for a node (default 300).")
@click.option("--termination-grace", type=int, default=None, help="Seconds a pod gets to stop (default 120).")
@click.option("--gpu-resource", default="", help="The GPUs' resource name (default: nvidia.com/gpu).")
def backend_add_kubernetes(
    name: str,
    kubeconfig_file: Any,
    in_cluster: bool,
    namespace: str,
    context: str,
    cluster: str,
    image: str,
    pull_secrets: tuple[str, ...],
    prices: tuple[str, ...],
    spot_prices: tuple[str, ...],
    default_price: float | None,
    selectors: tuple[str, ...],
    tolerations: tuple[str, ...],
    pools_file: Any,
    schedule_timeout: float | None,
    termination_grace: int | None,
    gpu_resource: str,
) -> None:
    """Connect a Kubernetes namespace: Trainyard runs one pod per job there.
    Its user needs deploy/kubernetes/backend-rbac.yaml's permissions; the
    server checks them, and lists the nodes, before saving anything."""
    if bool(kubeconfig_file) == in_cluster:
        raise click.UsageError("give --kubeconfig FILE, or --in-cluster (the server's own service account)")
    body: dict[str, Any] = {"kind": "kubernetes", "name": name, "namespace": namespace}
    if kubeconfig_file is not None:
        body["kubeconfig"] = kubeconfig_file.read()
    else:
        body["in_cluster"] = True
    texts = {"context": context, "cluster": cluster, "image": image, "gpu_resource": gpu_resource}
    body.update({k: v for k, v in texts.items() if v})
    if pull_secrets:
        body["image_pull_secrets"] = options.split_values(pull_secrets)
    if prices:
        body["prices"] = _prices(prices, "--price")
    if spot_prices:
        body["spot_prices"] = _prices(spot_prices, "--spot-price")
    if default_price is not None:
        body["default_price"] = default_price
    if selectors:
        body["node_selector"] = _labels(selectors)
    if tolerations:
        body["tolerations"] = [_toleration(t) for t in tolerations]
    if pools_file is not None:
        body["node_pools"] = _node_pools(pools_file)
    if schedule_timeout is not None:
        body["schedule_timeout_seconds"] = schedule_timeout
    if termination_grace is not None:
        body["termination_grace_seconds"] = termination_grace
    click.echo(f"Checking the cluster and namespace {namespace} …", err=True)
    added = common.client().add_backend(body)
    kube = added.get("kubernetes")
    where = f"cluster {kube['cluster'] or '?'}, {kube['nodes']} node(s)" if kube else "cluster ?"
    click.echo(f"Connected backend {added['name']} ({where}): {added['status']}", err=True)


@backend.command("setup")
@click.argument("kind", type=click.Choice(["aws"]))
@click.option("--bucket", default="", help="Fill the bucket into the permission policy.")
@click.option("--data-bucket", default="", help="Also let the role read this bucket (or pattern) for inputs: s3://…")
@click.option("--output-bucket", default="", help="Also let the role write this bucket (or pattern) for to: s3://…")
@options.json_option("Print the server's answer as JSON.")
def backend_setup(kind: str, bucket: str, data_bucket: str, output_bucket: str, as_json: bool) -> None:
    """Show your workspace's external id and the policies its AWS role needs
    (deploy/aws/role.yaml creates the role with them)."""
    setup = common.client().aws_setup(bucket=bucket, data_bucket=data_bucket, output_bucket=output_bucket)
    if as_json:
        common.print_json(setup)
        return
    _show_setup(setup, role_arn="")


@backend.command("ls")
@options.json_option("Print the API's backend objects (never credentials).")
def backend_ls(as_json: bool) -> None:
    """List the workspace's backends, their health and last error."""
    common.print_list(
        common.client().list_backends(),
        lambda b: [
            b["name"],
            b["kind"],
            b["status"],
            b.get("auth") or "-",
            _where(b),
            b.get("bucket") or "-",
            str(b.get("live_instances", 0)),
            age(b.get("validated_at")),
            truncate(b.get("status_reason") or ""),
        ],
        as_json=as_json,
        headers=["NAME", "KIND", "STATUS", "AUTH", "WHERE", "BUCKET", "LIVE", "VALIDATED", "REASON"],
        empty="No backends yet: connect one with `trainyard backend add aws …` or `… add kubernetes …`.",
    )


@backend.command("validate")
@click.argument("name")
def backend_validate(name: str) -> None:
    """Check backend NAME again; a broken one becomes active when every check passes."""
    checked = common.client().validate_backend(name)
    click.echo(f"Backend {checked['name']}: {checked['status']}", err=True)


@backend.command("rm")
@click.argument("name")
def backend_rm(name: str) -> None:
    """Remove backend NAME (refused while it has live instances)."""
    common.client().remove_backend(name)
    click.echo(f"Removed backend {name}", err=True)


def _where(b: Any) -> str:
    """AWS: its regions; Kubernetes: cluster/namespace."""
    kube = b.get("kubernetes")
    if kube:
        return f"{kube.get('cluster') or '-'}/{kube.get('namespace') or '-'}"
    return ",".join(b.get("regions") or []) or "-"


def _prices(values: tuple[str, ...], option: str) -> dict[str, float]:
    """``TYPE=USD`` options as instance type → price an hour."""
    out = {}
    for kind, price in _pairs(values, option, "TYPE=USD").items():
        try:
            out[kind] = float(price)
        except ValueError:
            raise click.BadParameter(f"{price!r} is not a price in USD (e.g. {kind}=1.25)", param_hint=option) from None
    return out


def _labels(values: tuple[str, ...]) -> dict[str, str]:
    return _pairs(values, "--node-selector", "LABEL=VALUE")


def _toleration(value: str) -> dict[str, str]:
    """``KEY[=VALUE]:EFFECT`` as a pod toleration (no value: any value, ``Exists``)."""
    spec, sep, effect = value.rpartition(":")
    if not sep or not spec or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise click.BadParameter(
            f"expected KEY[=VALUE]:EFFECT with EFFECT NoSchedule, PreferNoSchedule or NoExecute, got {value!r}",
            param_hint="--toleration",
        )
    key, has_value, text = spec.partition("=")
    if has_value:
        return {"key": key, "operator": "Equal", "value": text, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def _node_pools(file: Any) -> list[Any]:
    try:
        pools = json.load(file)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--node-pools") from None
    if not isinstance(pools, list):
        raise click.BadParameter("expected a JSON list of node pools", param_hint="--node-pools")
    return pools


def _pairs(values: tuple[str, ...], option: str, form: str = "REGION=ID") -> dict[str, str]:
    pairs = {}
    for value in values:
        region, sep, item = value.partition("=")
        if not sep or not region or not item:
            raise click.BadParameter(f"expected {form}, got {value!r}", param_hint=option)
        pairs[region.strip()] = item.strip()
    return pairs


def _per_region(subnets: tuple[str, ...], amis: tuple[str, ...], gpu_amis: tuple[str, ...]) -> dict[str, Any]:
    """The account's subnets and images by region, from the REGION=ID options given."""
    out: dict[str, Any] = {}
    by_region: dict[str, list[str]] = {}
    for value in subnets:
        for region, subnet in _pairs((value,), "--subnet").items():
            by_region.setdefault(region, []).append(subnet)
    if by_region:
        out["subnets"] = by_region
    if amis:
        out["amis"] = _pairs(amis, "--ami")
    if gpu_amis:
        out["gpu_amis"] = _pairs(gpu_amis, "--gpu-ami")
    return out


def _aws_secret() -> str:
    """The secret access key: $AWS_SECRET_ACCESS_KEY, a hidden prompt, or stdin."""
    value = os.environ.get("AWS_SECRET_ACCESS_KEY", "") or common.read_hidden("AWS secret access key")
    if not value:
        raise common.CliError(
            "no secret access key: pass --secret-access-key, set AWS_SECRET_ACCESS_KEY, or type it at the prompt"
        )
    return value


def _show_setup(setup: AwsSetup, *, role_arn: str) -> None:
    principal = setup["principal"] or "(not configured on the server: TRAINYARD_AWS_PRINCIPAL_ARN)"
    lines = [
        f"External id of this workspace: {setup['external_id']}",
        f"Trainyard's AWS principal: {principal}",
        f"The role{' ' + role_arn if role_arn else ''} must trust it with that external id (trust policy):",
        json.dumps(setup["trust_policy"], indent=2),
        "and carry this permission policy (or create both with deploy/aws/role.yaml):",
        json.dumps(setup["permission_policy"], indent=2),
    ]
    click.echo("\n".join(lines), err=True)

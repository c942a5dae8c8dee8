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
    """Cloud accounts the workspace runs machines in (docs/AWS.md in the Trainyard repository)."""


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
            ",".join(b.get("regions") or []) or "-",
            b.get("bucket") or "-",
            str(b.get("live_instances", 0)),
            age(b.get("validated_at")),
            truncate(b.get("status_reason") or ""),
        ],
        as_json=as_json,
        headers=["NAME", "KIND", "STATUS", "AUTH", "REGIONS", "BUCKET", "LIVE", "VALIDATED", "REASON"],
        empty="No backends yet: connect one with `trainyard backend add aws …`.",
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


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        region, sep, item = value.partition("=")
        if not sep or not region or not item:
            raise click.BadParameter(f"expected REGION=ID, got {value!r}", param_hint=option)
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

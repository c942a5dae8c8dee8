"""``trainyard data``: where the workspace's ``s3://`` inputs are read from
when it has no AWS account: an S3-compatible endpoint (MinIO, R2, Ceph…)
with its own keys (docs/DATA.md). The secret is read from a hidden prompt
or stdin, never from the command line, and never shown back."""

from __future__ import annotations

import json

import click

from ..api import DataEndpoint
from . import common, options


@click.group(cls=common.Group)
def data() -> None:
    """Data inputs (inputs: s3://… in a workflow): the workspace's S3-compatible endpoint."""


@data.group("endpoint", cls=common.Group, invoke_without_command=True)
@options.json_option("Print the API's answer (the URL, region and key id; never the secret).")
@click.pass_context
def endpoint(ctx: click.Context, as_json: bool) -> None:
    """Show the workspace's S3-compatible endpoint (as `show`)."""
    if ctx.invoked_subcommand is None:
        _show(common.client().data_endpoint(), as_json=as_json)


@endpoint.command("show")
@options.json_option("Print the API's answer (the URL, region and key id; never the secret).")
def endpoint_show(as_json: bool) -> None:
    """Show the workspace's S3-compatible endpoint."""
    _show(common.client().data_endpoint(), as_json=as_json)


@endpoint.command("set")
@click.argument("url")
@click.option("--access-key-id", default="", help="The endpoint's access key id (none: anonymous reads).")
@click.option("--region", default="", help="The region the endpoint signs for (default us-east-1).")
def endpoint_set(url: str, access_key_id: str, region: str) -> None:
    """Read the workspace's s3:// inputs from the S3-compatible endpoint URL
    (admins only), used when the workspace has no AWS account. With
    --access-key-id, the secret access key is read from a hidden prompt on a
    terminal, else from stdin.

    \b
    printf %s "$SECRET" | trainyard data endpoint set https://minio.example.com:9000 --access-key-id trainyard
    """
    secret = ""
    if access_key_id:
        secret = common.read_hidden("Secret access key", exact=True)
        if not secret:
            raise common.CliError(
                "empty secret access key: nothing was set (type it at the prompt, or pipe it: "
                f'printf %s "$SECRET" | trainyard data endpoint set {url} --access-key-id {access_key_id})'
            )
    api = common.client()
    found = api.set_data_endpoint(url, region=region, access_key_id=access_key_id, secret_access_key=secret)
    click.echo(
        f"Data endpoint of {api.workspace} set to {found['endpoint_url']}: s3:// inputs are read there "
        "when the workspace has no AWS account.",
        err=True,
    )


@endpoint.command("rm")
def endpoint_rm() -> None:
    """Forget the workspace's S3-compatible endpoint (admins only)."""
    api = common.client()
    api.remove_data_endpoint()
    click.echo(f"Removed the data endpoint of {api.workspace}", err=True)


def _show(found: DataEndpoint, *, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    click.echo(f"endpoint:      {found['endpoint_url']}")
    click.echo(f"region:        {found.get('region') or 'us-east-1 (default)'}")
    key = found.get("access_key_id") or ""
    click.echo(f"access key id: {key or 'none (anonymous reads)'}")
    click.echo(f"secret:        {'set (never shown)' if found.get('has_secret') else 'none'}")

"""``trainyard volume``: the workspace's persistent volumes (docs/DATA.md,
"Volumes"): an EBS volume in one zone of the AWS account, or a folder of the
local host or of one self-hosted machine, mounted by the jobs whose workflow
names it (``volumes: [NAME:/path]``), one running job at a time."""

from __future__ import annotations

from typing import Any

import click

from ..output import age, size
from . import common, options


@click.group(cls=common.Group)
def volume() -> None:
    """Persistent volumes: they outlive runs and machines; a job mounts one
    with `volumes: [NAME:/path]` in its workflow and runs where it is."""


@volume.command("create")
@click.argument("name")
@click.option("--size", "size_", required=True, help="How big, e.g. 500GB (EBS bills the size asked).")
@click.option(
    "--backend",
    type=click.Choice(["aws", "local", "self-hosted"]),
    required=True,
    help="aws: an EBS volume; local: a folder of the server's host; self-hosted: a folder of one machine.",
)
@click.option("--region", default="", help="aws: the region (default: the account's first).")
@click.option("--zone", default="", help="aws: the availability zone, e.g. us-east-1a (default: the region's first).")
@click.option("--machine", default="", help="self-hosted: the registered machine the folder is on.")
@options.json_option("Print the API's volume object.")
def volume_create(name: str, size_: str, backend: str, region: str, zone: str, machine: str, as_json: bool) -> None:
    """Create volume NAME."""
    body = {"name": name, "size": size_, "backend": backend, "region": region, "zone": zone, "machine": machine}
    made = common.client().create_volume(body)
    if as_json:
        common.print_json(made)
        return
    click.echo(f"Created volume {made['name']} ({_where(made)}, {size(made.get('size_bytes'))})", err=True)


@volume.command("ls")
@options.json_option("Print the API's volume objects.")
def volume_ls(as_json: bool) -> None:
    """List the workspace's volumes: where each is, its size, and the job it is attached to."""
    common.print_list(
        common.client().list_volumes(),
        lambda v: [
            v["name"],
            v["backend"],
            _where(v),
            size(v.get("size_bytes")),
            str(v.get("status", "")),
            _attached(v),
            age(v.get("created_at")),
        ],
        as_json=as_json,
        headers=["VOLUME", "BACKEND", "WHERE", "SIZE", "STATUS", "ATTACHED TO", "CREATED"],
        empty="No volumes yet: create one with `trainyard volume create NAME --size 100GB --backend aws`.",
    )


@volume.command("delete")
@click.argument("name")
def volume_delete(name: str) -> None:
    """Delete volume NAME and everything on it (refused while a job uses it)."""
    common.client().delete_volume(name)
    click.echo(f"Deleted volume {name}", err=True)


def _where(v: Any) -> str:
    if v.get("backend") == "self-hosted":
        return str(v.get("machine") or "-")
    return str(v.get("zone") or v.get("region") or "-")


def _attached(v: Any) -> str:
    held = v.get("attached_to")
    if held:
        return f"{held['run']}/{held['job_name']} ({held['job_status']})" + (
            f" on {v['attached_machine']}" if v.get("attached_machine") else ""
        )
    return f"{v['attached_machine']} (no job)" if v.get("attached_machine") else "-"

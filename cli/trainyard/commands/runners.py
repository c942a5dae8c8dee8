"""``trainyard runners`` (also ``trainyard runner``): the workspace's
self-hosted machines, the price per hour the workspace says each costs
(docs/COST.md, "Per backend"), and revoking one."""

from __future__ import annotations

import click

from ..api import Client, SelfHostedRunner
from . import common, options


@click.group(cls=common.Group)
def runners() -> None:
    """Self-hosted machines (registered with `trainyard-runner register`)."""


@runners.command("ls")
@options.json_option("Print the API's runner objects.")
def runners_ls(as_json: bool) -> None:
    """The workspace's self-hosted machines, with their price per hour (revoked ones last)."""
    common.print_list(
        common.client().list_runners(),
        _row,
        as_json=as_json,
        headers=["NAME", "STATUS", "HOST", "GPUS", "PRICE/H"],
        empty="No self-hosted machines: register one with `trainyard-runner register` (docs/RUNNER.md).",
    )


@runners.command("price")
@click.argument("name")
@click.argument("price_per_hour")
def runners_price(name: str, price_per_hour: str) -> None:
    """Set what the self-hosted machine NAME costs an hour, in USD (0: free;
    workspace admins). Costs read from then on price its whole billed time with it."""
    client = common.client()
    changed = client.set_runner_price(str(_live(client, name)["id"]), price_per_hour)
    click.echo(f"{name}: ${float(changed['price_per_hour']):.4f}/h ({changed['price_source']})")


@runners.command("revoke")
@click.argument("name")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def runners_revoke(name: str, yes: bool) -> None:
    """Revoke the self-hosted machine NAME (workspace admins): its runner's
    token is refused from now on, and a job it was running is retried
    elsewhere. To use the machine again, register it again."""
    client = common.client()
    found = _live(client, name)
    if not yes:
        click.confirm(f"Revoke runner {name}? Its token stops working now", abort=True, err=True)
    client.revoke_runner(str(found["id"]))
    click.echo(f"Revoked runner {name}.", err=True)


def _live(client: Client, name: str) -> SelfHostedRunner:
    live = [r for r in client.list_runners() if r["name"] == name and not r["revoked"]]
    if not live:
        raise common.CliError(f"No self-hosted runner named {name!r} in this workspace (see `trainyard runners ls`).")
    return live[0]


def _row(r: SelfHostedRunner) -> list[str]:
    status = "revoked" if r["revoked"] else r["status"]
    return [r["name"], status, r.get("hostname") or "-", str(len(r.get("gpus") or [])), _price(r)]


def _price(r: SelfHostedRunner) -> str:
    return f"${float(r.get('price_per_hour') or 0):.4f}"

"""``trainyard runner``: the workspace's self-hosted machines and the price
per hour the workspace says each costs (docs/COST.md, "Per backend")."""

from __future__ import annotations

import click

from ..api import SelfHostedRunner
from . import common, options


@click.group(cls=common.Group)
def runner() -> None:
    """Self-hosted machines (registered with `trainyard-runner register`)."""


@runner.command("ls")
@options.json_option("Print the API's runner objects.")
def runner_ls(as_json: bool) -> None:
    """The workspace's self-hosted machines, with their price per hour."""
    common.print_list(
        common.client().list_runners(),
        _row,
        as_json=as_json,
        headers=["NAME", "STATUS", "HOST", "GPUS", "PRICE/H"],
        empty="No self-hosted machines: register one with `trainyard-runner register` (docs/RUNNER.md).",
    )


@runner.command("price")
@click.argument("name")
@click.argument("price_per_hour")
def runner_price(name: str, price_per_hour: str) -> None:
    """Set what the self-hosted machine NAME costs an hour, in USD (0: free;
    workspace admins). Costs read from then on price its whole billed time with it."""
    client = common.client()
    live = [r for r in client.list_runners() if r["name"] == name and not r["revoked"]]
    if not live:
        raise common.CliError(f"No self-hosted runner named {name!r} in this workspace (see `trainyard runner ls`).")
    changed = client.set_runner_price(str(live[0]["id"]), price_per_hour)
    click.echo(f"{name}: ${float(changed['price_per_hour']):.4f}/h ({changed['price_source']})")


def _row(r: SelfHostedRunner) -> list[str]:
    status = "revoked" if r["revoked"] else r["status"]
    return [r["name"], status, r.get("hostname") or "-", str(len(r.get("gpus") or [])), _price(r)]


def _price(r: SelfHostedRunner) -> str:
    return f"${float(r.get('price_per_hour') or 0):.4f}"

"""``trainyard budget``: the workspace's monthly budgets and its members'
(and their GPU quotas), with what each counted this month (docs/COST.md,
"Budgets and quotas"). Everyone of the workspace sees them; admins set them."""

from __future__ import annotations

import sys

import click

from ..output import money, print_table
from . import common, options

OFF = ("off", "none")


@click.group(cls=common.Group, invoke_without_command=True)
@options.json_option("Print the API's budgets.")
@click.pass_context
def budget(ctx: click.Context, as_json: bool) -> None:
    """Show the workspace's budget and its members' with this month's spend.

    A budget caps what is spent in a calendar month (UTC): the workspace's
    counts every attempt and the idle line, a member's the runs they
    submitted. A submission that may take it past its limit is refused with
    the numbers (trainyard run --queue makes it wait instead).
    """
    if ctx.invoked_subcommand is not None:
        return
    shown = common.client().budgets()
    if as_json:
        common.print_json(shown)
        return
    click.echo(f"Budgets for {shown['month']} (UTC, {shown['currency']}):")
    rows = [
        [
            row["user"] or "(workspace)",
            money(row["monthly_limit"]) if row["monthly_limit"] is not None else "-",
            money(row["spent"]),
            f"{row['percent']:.1f}%" if row["percent"] is not None else "-",
            f"{money(row['rate_per_hour'])}/h",
            f"{row['gpus_running'] or 0}/{row['gpu_quota']}" if row["gpu_quota"] is not None else "-",
            f"{row['warn_percent']}%",
        ]
        for row in shown["budgets"]
    ]
    print_table(["BUDGET", "LIMIT", "SPENT", "USED", "RATE", "GPUS", "WARN AT"], rows, tty=sys.stdout.isatty())


@budget.command("set")
@click.argument("amount", metavar="USD")
@click.option("--user", metavar="NAME", default=None, help="A member's budget (default: the workspace's).")
@click.option("--warn", "warn", type=int, default=None, help="Notify at this percent (1-99; default 80).")
@click.option("--gpus", type=int, default=None, help="A member's quota of GPUs their running jobs hold at once.")
@options.json_option("Print the API's budget row.")
def budget_set(amount: str, user: str | None, warn: int | None, gpus: int | None, as_json: bool) -> None:
    """Set the monthly limit to USD (e.g. 500), or off for no limit (a
    member's GPU quota alone). Options left out keep their value."""
    body: dict[str, object] = {"monthly_limit": None if amount.lower() in OFF else amount}
    if warn is not None:
        body["warn_percent"] = warn
    if gpus is not None:
        body["gpu_quota"] = gpus
    row = common.client().set_budget(user, body)
    if as_json:
        common.print_json(row)
        return
    whose = f"{user}'s budget" if user else "The workspace's budget"
    limit = f"{money(row['monthly_limit'])} a month" if row["monthly_limit"] is not None else "no monthly limit"
    quota = f", at most {row['gpu_quota']} GPUs at once" if row["gpu_quota"] is not None else ""
    click.echo(f"{whose}: {limit}{quota}, notify at {row['warn_percent']}% ({money(row['spent'])} spent this month).")


@budget.command("rm")
@click.option("--user", metavar="NAME", default=None, help="A member's budget (default: the workspace's).")
def budget_rm(user: str | None) -> None:
    """Remove the workspace's budget (or a member's, with --user)."""
    common.client().remove_budget(user)
    whose = f"{user}'s" if user else "the workspace's"
    click.echo(f"Removed {whose} budget.")

"""``trainyard cost``: what the workspace spent, grouped, with the idle line
(docs/COST.md), in the manner of ``sky cost-report``."""

from __future__ import annotations

import sys

import click

from ..output import money, print_table
from . import common, options

GROUPS = ("user", "workflow", "backend", "day", "week", "month")


@click.command()
@click.option(
    "--since",
    metavar="WHEN",
    default=None,
    help="From this long ago (30d, 12h) or this date/time (2026-11-01); default: the start of this month (UTC).",
)
@click.option("--until", metavar="WHEN", default=None, help="Up to this long ago or this date/time; default: now.")
@click.option("--by", type=click.Choice(GROUPS), default="user", show_default=True, help="Group the rows by this.")
@options.json_option("Print the API's report.")
def cost(since: str | None, until: str | None, by: str, as_json: bool) -> None:
    """Show what the workspace's runs cost, by user, workflow, backend, day, week or month.

    A row is the cost of the attempts that started in the window; IDLE is
    what its machines cost while no job held them (between jobs, the rest of
    EC2's 60 s minimum). Amounts are USD, rounded only here.
    """
    api = common.client()
    report = api.cost_report(since=since, until=until, by=by)
    if as_json:
        common.print_json(report)
        return
    click.echo(f"Costs from {report['since']} to {report['until']} ({report['currency']}):")
    rows = [[row["key"] or "-", money(row["cost"])] for row in report["rows"]]
    rows += [["(idle)", money(report["idle"])], ["TOTAL", money(report["total"])]]
    print_table([by.upper(), "COST"], rows, tty=sys.stdout.isatty())

"""``trainyard show``: one run, its jobs as a DAG and what is known of each."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..api import FINISHED, ApiError
from ..output import (
    attempt_rows,
    cache_lines,
    cost_lines,
    dag_rows,
    data_lines,
    environment_lines,
    export_lines,
    guard_lines,
    input_lines,
    last_metrics_lines,
    money,
    port_lines,
    print_table,
    rerun_line,
)
from . import common, completers, options


@click.command()
@click.argument("run_name", metavar="RUN", shell_complete=completers.runs)
@options.json_option("Print the API's run object.")
def show(run_name: str, as_json: bool) -> None:
    """Show RUN's jobs: dependencies, status, timing, cache and artifacts."""
    api = common.client()
    current = api.get_run(run_name)
    if as_json:
        common.print_json(current)
        return
    reason = f" ({current['status_reason']})" if current.get("status_reason") else ""
    click.echo(f"Run {current['name']} of {current['workflow']}: {current['status']}{reason}")
    if current.get("cost") is not None:
        live = "" if current["status"] in FINISHED else " so far"
        click.echo(f"Cost: {money(current['cost'])}{live} (USD, every attempt of every job)")
    if current.get("max_cost") is not None:
        click.echo(f"Max cost: {money(current['max_cost'])} (the run is stopped by the budget when it is reached)")
    if current.get("budget_override"):
        click.echo("Budgets: overridden by an admin (the workspace's and the submitter's budgets do not stop it)")
    if rerun := rerun_line(current):
        click.echo(rerun)
    headers = ["JOB", "STATUS", "NEEDS", "STARTED", "DURATION", "CACHED FROM", "ARTIFACTS"]
    print_table(headers, dag_rows(current, api.list_artifacts(run_name)), tty=sys.stdout.isatty())
    attempts = attempt_rows(current)
    if attempts:
        click.echo("\nAttempts:")
        headers = ["JOB", "ATTEMPT", "INSTANCE", "WHERE", "STARTED", "ENDED", "REASON"]
        print_table(headers, attempts, tty=sys.stdout.isatty())
    jobs = current.get("jobs") or []
    sections = [
        ("Metrics (trainyard metrics RUN):", last_metrics_lines(_metrics(api, run_name))),
        ("Costs:", cost_lines(current)),
        ("Placement:", [f"  {j['name']}: {j['placement_note']}" for j in jobs if j.get("placement_note")]),
        ("Guards:", guard_lines(current)),
        ("Cache:", cache_lines(current)),
        ("Logs:", [f"  {j['name']}: {j['log_note']}" for j in jobs if j.get("log_note")]),
        ("Ports:", port_lines(current)),
        ("Inputs:", input_lines(current)),
        ("Data and volumes:", data_lines(current)),
        ("Exports:", export_lines(_exports(api, run_name))),
        ("Environments (trainyard env show KEY):", environment_lines(current)),
    ]
    for title, lines in sections:
        if lines:
            click.echo("\n".join(["", title, *lines]))


def _exports(api: Any, run_name: str) -> list[Any]:
    """The copies to ``to:`` destinations; none from a server without them (404)."""
    try:
        return list(api.list_exports(run_name))
    except ApiError as exc:
        if exc.status == 404:
            return []
        raise


def _metrics(api: Any, run_name: str) -> list[Any]:
    """Each job's last metric values; none from a server without metrics (404)."""
    try:
        return list(api.run_metrics(run_name)["jobs"])
    except ApiError as exc:
        if exc.status == 404:
            return []
        raise

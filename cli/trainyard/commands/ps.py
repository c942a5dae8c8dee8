"""``trainyard ps``: the workspace's runs, newest first."""

from __future__ import annotations

import itertools

import click

from ..api import Run
from ..output import age, duration, money, truncate
from . import common, options


@click.command()
@click.option("-a", "--all", "show_all", is_flag=True, help="All runs, not only the most recent ones.")
@options.json_option("Print the API's run objects as a JSON list.")
@click.option(
    "-n", "limit", type=click.IntRange(min=1), default=None, help="At most N runs (default 20; no limit with -a)."
)
def ps(show_all: bool, as_json: bool, limit: int | None) -> None:
    """List runs, newest first."""
    api = common.client()
    limit = limit if limit is not None else (None if show_all else 20)
    runs = list(itertools.islice(api.iter_runs(page_size=min(limit or 100, 100)), limit))
    reasons = any(_shown_reason(r) for r in runs)  # the REASON column

    def row(r: Run) -> list[str]:
        shown = [r["name"], r["workflow"], r["status"], age(r.get("created_at")), duration(r.get("duration_seconds"))]
        shown.append(money(r.get("cost")))
        return shown + ([truncate(_shown_reason(r))] if reasons else [])

    headers = ["NAME", "WORKFLOW", "STATUS", "SUBMITTED", "DURATION", "COST"] + (["REASON"] if reasons else [])
    empty = "No runs yet: start one with `trainyard run WORKFLOW`."
    common.print_list(runs, row, as_json=as_json, headers=headers, empty=empty)


def _shown_reason(run: Run) -> str:
    if run["status"] not in ("pending", "failed"):
        return ""
    return run.get("status_reason") or next((j["status_reason"] for j in run["jobs"] if j.get("status_reason")), "")

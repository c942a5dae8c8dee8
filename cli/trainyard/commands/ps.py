"""``trainyard ps``: the workspace's runs, newest first; the filters are the
runs list's (the server filters, so ``-n`` counts matching runs), and
``--watch`` redraws the table in place until Ctrl-C."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal

import click

from ..api import ApiError, Run
from ..output import age, duration, money, print_table, rich_table, truncate
from . import common, completers, options

RUN_STATUSES = ["pending", "running", "stopping", "succeeded", "failed", "stopped"]


@click.command()
@click.option("-a", "--all", "show_all", is_flag=True, help="All runs, not only the most recent ones.")
@options.json_option("Print the API's run objects as a JSON list.")
@click.option(
    "-n", "limit", type=click.IntRange(min=1), default=None, help="At most N runs (default 20; no limit with -a)."
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    metavar="STATUS",
    callback=lambda ctx, param, values: _statuses(values),
    help=f"Only runs in these statuses (repeatable or comma-separated: {', '.join(RUN_STATUSES)}).",
)
@click.option(
    "--workflow",
    default=None,
    metavar="NAME",
    shell_complete=completers.named("workflow"),
    help="Only runs of this workflow.",
)
@click.option(
    "--tag",
    default=None,
    metavar="NAME",
    shell_complete=completers.named("tag"),
    help="Only the run this tag points at.",
)
@click.option("--mine", is_flag=True, help="Only the runs you submitted.")
@click.option("-v", "--wide", "wide", is_flag=True, help="Also each run's backends, GPUs, price per hour and attempts.")
@click.option("--watch", is_flag=True, help="Redraw the list as runs change, until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.5),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="With --watch: how often the list is read again.",
)
def ps(
    show_all: bool,
    as_json: bool,
    limit: int | None,
    statuses: list[str],
    workflow: str | None,
    tag: str | None,
    mine: bool,
    wide: bool,
    watch: bool,
    interval: float,
) -> None:
    """List runs, newest first.

    -v adds BACKEND (the backends of the jobs' latest attempts), GPU (what
    the jobs asked for), PRICE (USD per hour of the machines the jobs'
    latest attempts ran on) and ATTEMPTS (every attempt of every job)."""
    if watch and as_json:
        raise click.UsageError("--watch redraws a table; it cannot be combined with --json")
    api = common.client()
    limit = limit if limit is not None else (None if show_all else 20)

    def fetch() -> list[Run]:
        runs = api.iter_runs(
            status=",".join(statuses) or None, workflow=workflow, tag=tag, mine=mine, page_size=min(limit or 100, 100)
        )
        return list(itertools.islice(runs, limit))

    filtered = bool(statuses or workflow or tag or mine)
    if watch:
        _watch(fetch, wide=wide, interval=interval, filtered=filtered)
        return
    runs = fetch()
    headers, rows = _table(runs, wide=wide)
    empty = "No runs match." if filtered else "No runs yet: start one with `trainyard run WORKFLOW`."
    shown = {id(r): row for r, row in zip(runs, rows, strict=True)}  # each run object's row, as made above
    common.print_list(runs, lambda r: shown[id(r)], as_json=as_json, headers=headers, empty=empty)


def _table(runs: list[Run], *, wide: bool) -> tuple[list[str], list[list[str]]]:
    """The headers and rows of ``runs`` (REASON only when a run has one)."""
    reasons = any(_shown_reason(r) for r in runs)
    headers = ["NAME", "WORKFLOW", "STATUS", "SUBMITTED", "DURATION", "COST"]
    headers += ["BACKEND", "GPU", "PRICE", "ATTEMPTS"] if wide else []
    headers += ["REASON"] if reasons else []

    def row(r: Run) -> list[str]:
        shown = [r["name"], r["workflow"], r["status"], age(r.get("created_at")), duration(r.get("duration_seconds"))]
        shown.append(money(r.get("cost")))
        shown += _wide(r) if wide else []
        return shown + ([truncate(_shown_reason(r))] if reasons else [])

    return headers, [row(r) for r in runs]


def _wide(run: Run) -> list[str]:
    """BACKEND, GPU, PRICE, ATTEMPTS of ``run``."""
    latest = [job["attempts"][-1] for job in run["jobs"] if job.get("attempts")]
    backends = list(dict.fromkeys(str(a["backend"]) for a in latest if a.get("backend")))
    gpus = [
        f"{res.get('gpu_name') or 'gpu'}:{res['gpu_count']}"
        for job in run["jobs"]
        if (res := job.get("resources") or {}).get("gpu_count")
    ]
    prices = [Decimal(str(a["price_per_hour"])) for a in latest if a.get("price_per_hour") is not None]
    price = f"{money(str(sum(prices)))}/h" if prices else "-"
    attempts = sum(len(job.get("attempts") or []) for job in run["jobs"])
    return [",".join(backends) or "-", ",".join(dict.fromkeys(gpus)) or "-", price, str(attempts)]


def _watch(fetch: Callable[[], list[Run]], *, wide: bool, interval: float, filtered: bool) -> None:
    """Read the runs every ``interval`` seconds and redraw them in place on a
    terminal (piped: print the table again whenever it changes), until Ctrl-C."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    empty = "No runs match." if filtered else "No runs yet."
    table: tuple[list[str], list[list[str]]] | None = None
    printed: tuple[list[str], list[list[str]]] | None = None
    live = Live(console=Console(highlight=False), auto_refresh=False) if sys.stdout.isatty() else None
    try:
        if live is not None:
            live.start()
        while True:
            note = ""
            try:
                table = _table(fetch(), wide=wide)
            except ApiError as e:  # keep the last table and say why it is not fresh
                note = f" (not refreshed: {e.message})"
            header = f"Every {interval:g}s · {datetime.now(UTC):%H:%M:%S} UTC · Ctrl-C to stop{note}"
            headers, rows = table or ([], [])
            if live is not None:
                live.update(Group(Text(header), rich_table(headers, rows) if rows else Text(empty)), refresh=True)
            elif table is not None and table != printed:
                printed = table
                click.echo(header)
                if rows:
                    print_table(headers, rows, tty=False)
                else:
                    click.echo(empty)
                click.echo("")
                sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return
    finally:
        if live is not None:
            live.stop()


def _statuses(values: tuple[str, ...]) -> list[str]:
    statuses = options.split_values(values)
    unknown = [s for s in statuses if s not in RUN_STATUSES]
    if unknown:
        raise click.BadParameter(
            f"unknown status {unknown[0]!r}; a run is {', '.join(RUN_STATUSES)}", param_hint="--status"
        )
    return statuses


def _shown_reason(run: Run) -> str:
    if run["status"] not in ("pending", "failed"):
        return ""
    return run.get("status_reason") or next((j["status_reason"] for j in run["jobs"] if j.get("status_reason")), "")

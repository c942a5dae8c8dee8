"""``trainyard metrics``: a run's jobs' metrics as a table with sparklines,
JSON or CSV, once or following the run (docs/METRICS.md)."""

from __future__ import annotations

import csv
import sys
import time
from typing import Any

import click

from ..api import FINISHED, JobSeries
from ..output import metric_value, print_table, sparkline
from . import common, completers, options

# Points asked for per series: a sparkline's width for the table, the
# server's default for JSON and CSV.
TABLE_POINTS = 48
FOLLOW_SECONDS = 5.0
# Following, the series are asked again from the latest point's time (the
# runner's clock) less this much: a late frame's points are not missed.
FOLLOW_OVERLAP_SECONDS = 60.0
GPU_SHOWN = (".util", ".memory")


@click.command()
@click.argument("run_name", metavar="RUN", shell_complete=completers.runs)
@click.option("--job", "jobs", multiple=True, metavar="JOB", help="Only this job (repeatable; default: every job).")
@click.option(
    "--name",
    "names",
    multiple=True,
    metavar="NAME",
    help="Only this metric (repeatable: loss, cpu, memory, gpu0.util, …); default: the training metrics, CPU, "
    "memory and each GPU's utilisation and memory.",
)
@click.option("--follow", "-f", is_flag=True, help="Keep reading while the run runs: redraw the table, append rows.")
@options.json_option("Print the API's series (every point the server keeps, downsampled to 1000 a series).")
@click.option("--csv", "as_csv", is_flag=True, help="Print one row a point: job,metric,attempt,x,y,min,max.")
def metrics(
    run_name: str, jobs: tuple[str, ...], names: tuple[str, ...], follow: bool, as_json: bool, as_csv: bool
) -> None:
    """Show RUN's metrics: training values and the jobs' CPU, memory and GPUs."""
    if as_json and as_csv:
        raise common.CliError("--json and --csv: choose one.")
    if follow and as_json:
        raise common.CliError("--follow prints a table or CSV rows as they come; --json prints once.")
    api = common.client()
    summary = api.run_metrics(run_name)
    known = [job["job"] for job in summary["jobs"]]
    unknown = [job for job in jobs if job not in known]
    if unknown:
        raise common.CliError(f"run {run_name} has no job {unknown[0]!r}; its jobs: {', '.join(known) or 'none'}.")
    chosen = [job for job in summary["jobs"] if not jobs or job["job"] in jobs]
    wanted = {job["job"]: list(names) or _default_names(job) for job in chosen}
    if as_json:
        common.print_json([api.job_series(run_name, job, names=wanted[job]) for job in wanted])
        return
    if as_csv:
        _csv(api, run_name, wanted, follow)
        return
    tty = sys.stdout.isatty()
    while True:
        answers = [api.job_series(run_name, job, names=wanted[job], points=TABLE_POINTS) for job in wanted]
        rows = [_row(answer["job"], series) for answer in answers for series in answer["series"]]
        if follow and tty:
            click.echo("\x1b[H\x1b[2J", nl=False)  # redraw in place
        if rows:
            print_table(["JOB", "METRIC", "ATTEMPT", "AT", "LAST", "MIN", "MAX", "TREND"], rows, tty=tty)
        else:
            click.echo(f"No metrics yet for run {run_name}.", err=True)
        if not follow or _finished(api, run_name):
            return
        if not tty:
            click.echo("")
        time.sleep(FOLLOW_SECONDS)


def _default_names(job: Any) -> list[str]:
    gpus = [name for name in job["system"] if name.startswith("gpu") and name.endswith(GPU_SHOWN)]
    return [*job["training"], *[n for n in ("cpu", "memory") if n in job["system"]], *gpus]


def _row(job: str, series: Any) -> list[str]:
    points = series["points"]
    if not points["y"]:
        return [job, series["name"], "-", "-", "-", "-", "-", ""]
    unit = series.get("unit", "")
    low = points.get("min") or points["y"]
    high = points.get("max") or points["y"]
    x = points["x"][-1]
    at = f"step {int(x)}" if series["x"] == "step" else time.strftime("%H:%M:%S", time.localtime(x))
    return [
        job,
        series["name"],
        str(points["attempt"][-1]),
        at,
        metric_value(points["y"][-1], unit),
        metric_value(min(low), unit),
        metric_value(max(high), unit),
        sparkline(points["y"]),
    ]


def _finished(api: Any, run_name: str) -> bool:
    return api.get_run(run_name)["status"] in FINISHED


def _csv(api: Any, run_name: str, wanted: dict[str, list[str]], follow: bool) -> None:
    """Every point once; following, each poll adds the points after the last printed of each series."""
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["job", "metric", "attempt", "x", "y", "min", "max"])
    printed: dict[tuple[str, str], tuple[int, float]] = {}
    latest: float | None = None
    while True:
        since = None if latest is None else latest - FOLLOW_OVERLAP_SECONDS
        for job, names in wanted.items():
            answer: JobSeries = api.job_series(run_name, job, names=names, since=since)
            for series in answer["series"]:
                _csv_rows(writer, job, series, printed)
                times = series["points"].get("t") or (series["points"]["x"] if series["x"] == "time" else [])
                latest = max([*times, *([] if latest is None else [latest])], default=None)
        sys.stdout.flush()
        if not follow or _finished(api, run_name):
            return
        time.sleep(FOLLOW_SECONDS)


def _csv_rows(writer: Any, job: str, series: Any, printed: dict[tuple[str, str], tuple[int, float]]) -> None:
    points = series["points"]
    key = (job, series["name"])
    last = printed.get(key, (0, float("-inf")))
    for i, x in enumerate(points["x"]):
        here = (points["attempt"][i], x)
        if here <= last:
            continue
        low = points["min"][i] if "min" in points else ""
        high = points["max"][i] if "max" in points else ""
        writer.writerow([job, series["name"], here[0], _num(x), _num(points["y"][i]), _num(low), _num(high)])
        last = here
    printed[key] = last


def _num(value: Any) -> str:
    if value == "" or value is None:
        return ""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))

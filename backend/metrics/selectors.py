"""Reads of a job's metrics for the guards and the API (docs/METRICS.md).

The guards' reads (``last_training_value_at``, ``gpu_peak_since``,
``last_sample_at``) take an attempt's id and read one row or the few blocks
of a window."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from backend.accounts.models import Workspace
from backend.billing.selectors import run_costs
from backend.metrics.blocks import Minutes, Samples, Values, at
from backend.metrics.downsample import TimePoints, bucket_width, by_runs, by_time
from backend.metrics.models import AttemptMetrics, Level, SystemBlock, TrainingBlock
from backend.metrics.series import is_gpu_util, order_key, unit_of
from backend.runs.models import Attempt, AttemptStatus, Job, Run, runs_named


@dataclass(frozen=True)
class GpuPeak:
    """The highest utilisation (percent) of any GPU over an attempt's samples
    at or after a time, the time of the first of those samples and of the
    last (a window is covered when ``first_at`` is near its start)."""

    util: float
    first_at: datetime
    last_at: datetime


def last_training_value_at(attempt_id: UUID | str) -> datetime | None:
    """When a new training value of the attempt was last stored (the server's clock)."""
    return AttemptMetrics.objects.filter(attempt_id=attempt_id).values_list("last_value_at", flat=True).first()


def last_sample_at(attempt_id: UUID | str) -> datetime | None:
    """The time of the attempt's latest system sample (as the runner stamped it)."""
    return AttemptMetrics.objects.filter(attempt_id=attempt_id).values_list("last_sample_at", flat=True).first()


def gpu_peak_since(attempt_id: UUID | str, since: datetime) -> GpuPeak | None:
    """The attempt's GPU samples at or after ``since``: their highest
    utilisation of any GPU and the first and last sample's time; None when
    it has no GPU sample since then. Per-minute blocks (older than the raw
    hours) count with their minutes that start at or after ``since``, at
    their max."""
    cutoff = since.timestamp()
    peak, first, last = -math.inf, math.inf, -math.inf
    blocks = SystemBlock.objects.filter(attempt_id=attempt_id, t_last__gte=since).only(
        "level", "names", "count", "data"
    )
    for block in blocks.iterator():
        gpus = [name for name in block.names if is_gpu_util(name)]
        if not gpus:
            continue
        if block.level == Level.MINUTES:
            minutes = Minutes.decode(block.data, block.names, block.count)
            times, columns = minutes.t, [minutes.high[name] for name in gpus]
        else:
            samples = Samples.decode(block.data, block.names, block.count)
            times, columns = samples.t, [samples.values[name] for name in gpus]
        for i, t in enumerate(times):
            if t < cutoff:
                continue
            here = [column[i] for column in columns if not math.isnan(column[i])]
            if not here:
                continue
            peak, first, last = max(peak, *here), min(first, t), max(last, t)
    if peak == -math.inf:
        return None
    return GpuPeak(util=peak, first_at=at(first), last_at=at(last))


# ------------------------------------------------------------------ the API


def run_for_metrics(*, workspace: Workspace, ref: str) -> Run | None:
    """The run ``ref`` names within ``workspace`` (``runs.models.runs_named``)."""
    return runs_named(Run.objects.for_workspace(workspace), ref).first()


def _iso(t: float) -> str:
    return at(t).isoformat().replace("+00:00", "Z")


def attempts_of(job: Job) -> list[dict[str, Any]]:
    return [
        {
            "number": a.number,
            "started_at": a.started_at,
            "finished_at": a.finished_at,
            "termination_reason": a.termination_reason,
        }
        for a in Attempt.objects.filter(job=job).order_by("number")
    ]


@dataclass
class JobSummary:
    """What a job's attempts say of its metrics: the series' names, each
    one's latest value (with its attempt), and the counters summed."""

    system: list[str]
    training: list[str]
    last: dict[str, dict[str, Any]]
    dropped: int
    malformed: int
    frames_dropped: int


def job_summary(job: Job) -> JobSummary:
    states = list(AttemptMetrics.objects.filter(job=job).order_by("number"))
    system: set[str] = set()
    training: list[str] = []
    last: dict[str, dict[str, Any]] = {}
    for state in states:
        system.update(state.system_names)
        training += [name for name in state.training_names if name not in training]
        for name, entry in state.last.items():
            if name not in last or entry["t"] >= last[name]["t"]:
                last[name] = {**entry, "attempt": state.number}
    return JobSummary(
        system=sorted(system, key=order_key),
        training=training,
        last={name: {**entry, "t": _iso(entry["t"])} for name, entry in last.items()},
        dropped=sum(s.dropped for s in states),
        malformed=sum(s.malformed for s in states),
        frames_dropped=sum(s.frames_dropped for s in states),
    )


def run_metrics(run: Run) -> list[dict[str, Any]]:
    """Per job of ``run``: its attempts, series' names, last values and counters."""
    out = []
    for job in Job.objects.filter(run=run).order_by("created_at", "name"):
        summary = job_summary(job)
        out.append(
            {
                "job": job.name,
                "attempts": attempts_of(job),
                "system": summary.system,
                "training": summary.training,
                "last": summary.last,
                "dropped": summary.dropped,
                "malformed": summary.malformed,
                "frames_dropped": summary.frames_dropped,
            }
        )
    return out


def job_of_run(run: Run, name: str) -> Job | None:
    return Job.objects.filter(run=run, name=name).first()


def job_series(
    job: Job, *, names: list[str] | None, since: float | None, until: float | None, points: int
) -> list[dict[str, Any]]:
    """The job's series named in ``names`` (None: every one), their points
    within [since, until] (Unix seconds; a step series by its values'
    times), at most ``points`` each. Unknown names are left out."""
    summary = job_summary(job)
    wanted = summary.system + summary.training if names is None else names
    system = [name for name in wanted if name in summary.system]
    training = [name for name in wanted if name in summary.training]
    gathered = system_points(job, system, since, until)
    out: list[dict[str, Any]] = []
    for name in wanted:
        if name in gathered:
            out.append(_system_out(name, gathered[name], points))
        elif name in training:
            out.append(_training_out(job, name, since, until, points))
    return out


def system_points(job: Job, names: list[str], since: float | None, until: float | None) -> dict[str, TimePoints]:
    """Each of ``names`` over the job's blocks in [since, until], one decode
    per block; per-minute blocks give their minutes (their count of samples
    weighs their mean). A missing value stays NaN here (``_system_out``
    leaves it out)."""
    out = {name: TimePoints() for name in names}
    if not names:
        return out
    blocks = SystemBlock.objects.filter(job=job)
    if since is not None:
        blocks = blocks.filter(t_last__gte=at(since))
    if until is not None:
        blocks = blocks.filter(t_first__lte=at(until))
    low, high = since if since is not None else -math.inf, until if until is not None else math.inf
    for block in blocks.order_by("number", "t_first", "id").iterator():
        here = [name for name in names if name in block.names]
        if not here:
            continue
        if block.level == Level.MINUTES:
            m = Minutes.decode(block.data, block.names, block.count)
            a, b = bisect_left(m.t, low), bisect_right(m.t, high)
            for name in here:
                out[name].minutes = True
                out[name].extend(m.t[a:b], m.mean[name][a:b], m.low[name][a:b], m.high[name][a:b], m.count[a:b],
                                 block.number)  # fmt: skip
        else:
            s = Samples.decode(block.data, block.names, block.count)
            a, b = bisect_left(s.t, low), bisect_right(s.t, high)
            ones = [1] * (b - a)
            for name in here:
                column = s.values[name][a:b]
                out[name].extend(s.t[a:b], column, column, column, ones, block.number)
    return out


def _system_out(name: str, points: TimePoints, most: int) -> dict[str, Any]:
    resolution = "1m" if points.minutes else "raw"
    if len(points.x) > most:
        span = max(points.x) - min(points.x)
        width = bucket_width(span, most, 60 if points.minutes else 0)
        points = by_time(points, width)
        resolution = "1m" if width == 60 else f"{int(width)}s"
    else:
        points = points.without_missing()
    return {
        "name": name,
        "kind": "system",
        "x": "time",
        "unit": unit_of(name),
        "resolution": resolution,
        "points": {"x": points.x, "y": points.y, "min": points.low, "max": points.high, "attempt": points.attempt},
    }


def _training_out(job: Job, name: str, since: float | None, until: float | None, most: int) -> dict[str, Any]:
    x, y, attempt, t, kind = training_points(job, name, since, until)
    x, y, attempt, t = by_runs(x, y, attempt, t, most)
    return {
        "name": name,
        "kind": "training",
        "x": kind,
        "unit": "",
        "points": {"x": x, "y": y, "attempt": attempt, "t": t},
    }


def training_points(
    job: Job, name: str, since: float | None, until: float | None
) -> tuple[list[float], list[float], list[int], list[float], str]:
    """The metric's values over the job's attempts, in attempt then key
    order: (x, y, attempt, each value's time, "step" or "time"). A metric
    given with steps is keyed by step (its values without one are left
    out); else by time."""
    blocks = TrainingBlock.objects.filter(job=job, name=name)
    if since is not None:
        blocks = blocks.filter(t_last__gte=at(since))
    if until is not None:
        blocks = blocks.filter(t_first__lte=at(until))
    rows = list(blocks.order_by("number", "t_first", "id"))
    by_step = any(row.by_step for row in rows)
    low, high = since if since is not None else -math.inf, until if until is not None else math.inf
    keyed: list[tuple[int, float, float, float]] = []
    for row in rows:
        if row.by_step != by_step:
            continue
        values = Values.decode(row.data, row.count, by_step=row.by_step)
        for i, t in enumerate(values.t):
            if low <= t <= high:
                key = float(values.step[i]) if values.step is not None else t
                keyed.append((row.number, key, values.v[i], t))
    keyed.sort()
    return (
        [k for _, k, _, _ in keyed],
        [v for _, _, v, _ in keyed],
        [n for n, _, _, _ in keyed],
        [t for _, _, _, t in keyed],
        "step" if by_step else "time",
    )


def run_params(run: Run) -> dict[str, str]:
    """What the run was given: each ``-e`` (and shell) variable as
    ``"-e NAME"`` with a short keyed digest of its value (the values are
    secrets: equal values show equal, none is shown), each workflow
    variable as ``"var NAME"`` with its value, and the arguments after
    ``--`` as ``"--"``."""
    params: dict[str, str] = {}
    for spec in Job.objects.filter(run=run).order_by("created_at").values_list("spec", flat=True):
        for name, digest in sorted((spec or {}).get("private_env", {}).items()):
            params.setdefault(f"-e {name}", f"sha:{str(digest)[:8]}")
    for name, value in sorted((run.variables or {}).items()):
        params[f"var {name}"] = str(value)
    if run.run_args:
        params["--"] = " ".join(str(arg) for arg in run.run_args)
    return params


def run_compared(run: Run, *, names: list[str] | None, points: int, now: datetime) -> dict[str, Any]:
    """One run of a comparison: who it is, its params and cost, the latest
    value of each training metric (over its jobs), and each job's series
    named in ``names`` (None: its training metrics)."""
    last: dict[str, tuple[str, float]] = {}
    series: list[dict[str, Any]] = []
    for job in Job.objects.filter(run=run).order_by("created_at", "name"):
        summary = job_summary(job)
        for name in summary.training:
            entry = summary.last.get(name)
            if entry is not None and (name not in last or entry["t"] >= last[name][0]):
                last[name] = (entry["t"], entry["value"])
        for one in job_series(job, names=names if names is not None else summary.training, since=None, until=None,
                              points=points):  # fmt: skip
            kept = {key: one["points"][key] for key in ("x", "y", "attempt")}
            series.append({"name": one["name"], "job": job.name, "x": one["x"], "points": kept})
    cost = run_costs([run.pk], now).get(run.pk)
    return {
        "run": run.name,
        "workflow": run.workflow,
        "status": run.status,
        "commit": run.commit,
        "params": run_params(run),
        "cost": None if cost is None else str(cost),
        "last": {name: value for name, (_, value) in last.items()},
        "series": series,
    }


# ----------------------------------------------------------- Prometheus


@dataclass(frozen=True)
class JobGauges:
    workspace: str
    run: str
    job: str
    last: dict[str, dict[str, Any]]


MAX_GAUGED_JOBS = 2000


def dangerously_all_workspaces_running_job_gauges() -> list[JobGauges]:
    """Every workspace's running jobs' latest system sample (their current
    attempt's), for the operator's /metrics; at most MAX_GAUGED_JOBS, the
    most recently sampled first."""
    rows = (
        AttemptMetrics.objects.filter(attempt__status=AttemptStatus.RUNNING, last_sample_at__isnull=False)
        .order_by("-last_sample_at")
        .values_list("job__run__workspace__slug", "job__run__name", "job__name", "last")[:MAX_GAUGED_JOBS]
    )
    return [JobGauges(workspace=ws, run=run, job=job, last=last) for ws, run, job, last in rows]

"""(13) Metrics storage: one job-day of metrics at 5 s with 8 GPUs written
through the block writer (``backend.metrics.services.ingest.metrics_store``,
what every runner's frame goes through once it is fenced), one sample a
frame as a runner sends them, and two training metrics every 5 s; then
compaction as the beat runs it. Postgres's own size of the metrics tables
(``pg_total_relation_size`` after ``VACUUM FULL``) before and after is the
job-day's cost, in two states: a running job (its last
``TRAINYARD_METRICS_RAW_HOURS`` at full resolution, the rest per minute)
and a finished day (every hour per minute). Also: the database time one
frame costs, and how long the series endpoint takes to answer a 7-day
8-GPU job's every series (the dashboard's Metrics tab asks for it), and
that job's Metrics tab in Chromium (bench/metricstab.py).

The seeded run is finished (its job and attempt ended), so nothing else of
the stack acts on it; the bench's database is dropped at the end."""

from __future__ import annotations

import math
import os
import statistics
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from bench.lib import Api, log
from bench.metricstab import bench_metrics_tab, tab_rows

TARGET_DAY_BYTES = 5_000_000
TARGET_SERIES_MS = 1000.0
SLUG = "bench-metrics"
INTERVAL = 5.0
GPUS = 8
DAY = 86_400
TABLES = ("metrics_systemblock", "metrics_trainingblock", "metrics_attemptmetrics")


def bench_metrics(api: Api, database_url: str, *, week: bool = True) -> dict[str, Any]:
    _django(database_url)
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from backend.metrics.services.compact import metrics_compact

    raw_hours = settings.TRAINYARD["METRICS_RAW_HOURS"]
    workspace, attempt, job = _seed_rows("day")
    before = _sizes(connection)
    end = math.floor(time.time() / 3600) * 3600.0  # the day ends at the last hour's start
    stored_s = _write(attempt, job, end - DAY, DAY)
    frames = DAY // int(INTERVAL)
    log(f"(13) metrics: a job-day ({frames:,} frames, 8 GPUs, 2 training metrics) stored in {stored_s:.1f} s")
    now = timezone.now()
    metrics_compact(now=now + timedelta(minutes=3), budget_seconds=600)
    running = _sizes(connection)
    metrics_compact(now=now + timedelta(hours=raw_hours + 2), budget_seconds=600)
    finished = _sizes(connection)
    result: dict[str, Any] = {
        "frames": frames,
        "series": 6 + 5 * GPUS,
        "frame_ms": round(stored_s / frames * 1000, 2),
        "raw_hours": raw_hours,
        "running_day_bytes": running["total"] - before["total"],
        "finished_day_bytes": finished["total"] - before["total"],
        "tables_before": before,
        "tables_running": running,
        "tables_finished": finished,
    }
    log(
        f"(13) metrics: {result['running_day_bytes']:,} bytes a job-day running, {result['finished_day_bytes']:,} downsampled"
    )
    if week:
        result["week"] = _week_series(api, workspace, connection, now)
        try:
            result["tab"] = bench_metrics_tab(api, SLUG, result["week"]["run"])
        except Exception as error:  # the other rows still print
            log(f"(13) metrics: the Metrics tab: {type(error).__name__}: {error}")
            result["tab"] = {"error": f"{type(error).__name__}: {error}"}
    return result


def _django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backend.config.settings")
    import django

    django.setup()


def _seed_rows(name: str) -> tuple[Any, Any, Any]:
    """A finished run of one job with one attempt, in the bench's workspace."""
    from backend.accounts.models import Membership, Role, User, Workspace
    from backend.runs.models import Attempt, AttemptStatus, Job, JobStatus, Run, RunStatus

    user = User.objects.get(username="bench")
    workspace, made = Workspace.objects.get_or_create(slug=SLUG, defaults={"name": "Bench metrics"})
    if made:
        Membership.objects.create(workspace=workspace, user=user, role=Role.ADMIN)
    run = Run.objects.create(
        workspace=workspace,
        name=f"metrics-{name}-{uuid.uuid4().hex[:6]}",
        workflow="train",
        status=RunStatus.SUCCEEDED,
        code_kind="git",
        workflows_file_path=".trainyard/workflows.yaml",
        workflows_file_text="",
    )
    job = Job.objects.create(
        workspace=workspace, run=run, name="train", workflow="train", spec={}, status=JobStatus.SUCCEEDED, attempt=1
    )
    attempt = Attempt.objects.create(workspace=workspace, job=job, number=1, status=AttemptStatus.ENDED)
    return workspace, attempt, job


def _frame(job_id: str, t: float, step: int) -> Any:
    from trainyard_runner import protocol

    phase = t / 600.0
    gpus = [
        protocol.GpuSample(
            index=i,
            util=90.0 + 9.0 * math.sin(phase + i),
            mem_used=int((71.3 + math.sin(phase)) * 2**30),
            mem_total=80 * 2**30,
            power_w=380.0 + 20.0 * math.sin(phase * 3 + i),
            temp_c=64.0 + 3.0 * math.sin(phase + i),
        )
        for i in range(GPUS)
    ]
    sample = protocol.SystemSample(
        t=t,
        cpu=400.0 + 300.0 * math.sin(phase * 7),
        rss=int(12 * 2**30 + 2**28 * math.sin(phase)),
        disk_used=int(400 * 2**30 + step * 4096),
        disk_total=2 * 2**40,
        net_rx=1e6 * (1 + math.sin(phase * 5)),
        net_tx=2e5 * (1 + math.sin(phase * 5)),
        gpus=gpus,
    )
    training = [
        protocol.TrainingValue(
            name="loss", value=2.3 * math.exp(-step / 5000) + 0.01 * math.sin(step), step=step, t=t, source="log"
        ),
        protocol.TrainingValue(name="lr", value=3e-4 * (1 - step / 20000), step=step, t=t, source="file"),
    ]
    return protocol.Metrics(job=job_id, attempt=1, system=[sample], training=training)


def _write(attempt: Any, job: Any, start: float, seconds: int) -> float:
    from backend.metrics.services.ingest import metrics_store

    started = time.monotonic()
    for i in range(int(seconds / INTERVAL)):
        t = start + i * INTERVAL
        metrics_store(attempt_id=attempt.pk, job_id=str(job.pk), message=_frame(str(job.pk), t, i))
    return time.monotonic() - started


def _sizes(connection: Any) -> dict[str, int]:
    sizes = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"VACUUM FULL {table}")
            cursor.execute("SELECT pg_total_relation_size(%s)", [table])
            sizes[table] = int(cursor.fetchone()[0])
    sizes["total"] = sum(sizes.values())
    return sizes


def _week_series(api: Api, workspace: Any, connection: Any, now: datetime) -> dict[str, Any]:
    """A 7-day 8-GPU job seeded as compaction leaves it (per minute, but its
    last raw hours), then the series endpoint asked for every series, as the
    Metrics tab asks at first: median and max of 5 requests."""
    from backend.metrics.blocks import Minutes, Samples, at, minutes_of
    from backend.metrics.models import AttemptMetrics, Level, SystemBlock
    from backend.metrics.series import order_key, sample_values

    _, attempt, job = _seed_rows("week")
    end = math.floor(time.time() / 3600) * 3600.0
    start = end - 7 * DAY
    started = time.monotonic()
    hours = int(7 * DAY / 3600)
    blocks = []
    for h in range(hours):
        hour = start + h * 3600
        frames = [_frame(str(job.pk), hour + i * INTERVAL, int((hour - start) / INTERVAL) + i) for i in range(720)]
        rows = [sample_values(f.system[0]) for f in frames]
        names = sorted(rows[0], key=order_key)
        samples = Samples(t=[f.system[0].t for f in frames], values={n: [r[n] for r in rows] for n in names})
        recent = hour >= end - 6 * 3600
        data: Samples | Minutes = samples if recent else minutes_of(samples)
        blocks.append(
            SystemBlock(
                attempt_id=attempt.pk, job_id=job.pk, number=1, level=Level.RAW if recent else Level.MINUTES,
                bucket=at(hour), t_first=at(samples.t[0]), t_last=at(samples.t[-1]), count=len(data.t),
                names=names, data=data.encode(),
            )
        )  # fmt: skip
    SystemBlock.objects.bulk_create(blocks)
    last = {n: {"value": v, "step": None, "t": end} for n, v in sample_values(frames[-1].system[0]).items()}
    AttemptMetrics.objects.create(attempt=attempt, job=job, number=1, system_names=names, last=last,
                                  last_sample_at=at(end))  # fmt: skip
    seed_s = round(time.monotonic() - started, 1)
    timings = []
    answer: dict[str, Any] = {}
    for _ in range(5):
        began = time.monotonic()
        answer = api.get(f"/api/v1/workspaces/{SLUG}/runs/{job.run.name}/metrics/series/?job=train")
        timings.append((time.monotonic() - began) * 1000)
    points = sum(len(s["points"]["x"]) for s in answer["series"])
    result = {
        "run": job.run.name,
        "seed_seconds": seed_s,
        "series": len(answer["series"]),
        "points": points,
        "resolution": sorted({s.get("resolution", "") for s in answer["series"]}),
        "median_ms": round(statistics.median(timings), 1),
        "max_ms": round(max(timings), 1),
    }
    log(f"(13) metrics: a 7-day 8-GPU job's every series: {result}")
    return result


def metrics_rows(result: dict[str, Any], row: Any) -> None:
    mb = 1_000_000
    row(
        f"metrics: storage per job-day, 5 s, {GPUS} GPUs, downsampled (finished day)",
        f"{result['finished_day_bytes'] / mb:.2f} MB",
        f"≤ {TARGET_DAY_BYTES / mb:.0f} MB",
        0 < result["finished_day_bytes"] <= TARGET_DAY_BYTES,  # nothing grew: other rows were deleted meanwhile
    )
    row(
        f"metrics: storage per job-day while running (last {result['raw_hours']:g} h at 5 s)",
        f"{result['running_day_bytes'] / mb:.2f} MB",
        f"≤ {TARGET_DAY_BYTES / mb:.0f} MB",
        0 < result["running_day_bytes"] <= TARGET_DAY_BYTES,
    )
    row("metrics: database time per frame (1 sample, 2 values)", f"{result['frame_ms']:.2f} ms", "-", None)
    week = result.get("week")
    if week:
        row(
            f"metrics: series endpoint, 7-day {GPUS}-GPU job, every series ({week['points']:,} points)",
            f"{week['median_ms']:.0f} ms median, {week['max_ms']:.0f} ms max",
            f"≤ {TARGET_SERIES_MS:.0f} ms",
            week["max_ms"] <= TARGET_SERIES_MS,
        )
    if "tab" in result:
        tab_rows(result["tab"], row)

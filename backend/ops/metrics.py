"""Prometheus metrics, the same whichever process a scrape reaches.

Gauges are read from Postgres at scrape time (``selectors``); counters, the
provisioning histogram and open websockets from Redis, where every process
adds to them (``backend.core.counters``). Nothing is kept in this process's
memory (docs/decisions/0048-metrics-in-shared-stores.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from backend.core import counters
from backend.ops.selectors import (
    dangerously_all_workspaces_cost_rates,
    dangerously_all_workspaces_gauges,
    dangerously_all_workspaces_job_gauges,
)


class TrainyardCollector(Collector):
    def describe(self) -> Iterable[Metric]:
        return []  # registering must not query anything

    def collect(self) -> Iterable[Metric]:
        yield from _database_metrics()
        yield from _job_metrics()
        yield from _cost_metrics()
        yield from _redis_metrics()


def render() -> bytes:
    """The exposition text; raises if the database or Redis cannot be read
    (the caller answers 503: a scrape with missing series would look like zeros)."""
    return generate_latest(_REGISTRY)


def _database_metrics() -> Iterable[Metric]:
    gauges = dangerously_all_workspaces_gauges()
    now = timezone.now()
    runs = GaugeMetricFamily("trainyard_runs", "Runs by state.", labels=["state"])
    for state, count in gauges.runs_by_state.items():
        runs.add_metric([state], count)
    yield runs
    yield GaugeMetricFamily("trainyard_jobs_pending", "Jobs waiting for a runner.", value=gauges.pending_jobs)
    yield GaugeMetricFamily(
        "trainyard_schedule_lag_seconds",
        "How long the longest-waiting schedulable job (its needs done) has waited for a runner; 0 when none waits.",
        value=_age(now, gauges.oldest_ready_since),
    )
    yield GaugeMetricFamily(
        "trainyard_heartbeat_lag_seconds",
        "Age of the oldest runner heartbeat among running jobs; 0 when nothing runs.",
        value=_age(now, gauges.oldest_heartbeat),
    )


# Per running job (docs/METRICS.md, "Prometheus"): its current attempt's
# latest sample. Labels are bounded: workspace, run and job (a few per
# running job, gone when it ends) and the GPU's index.
JOB_LABELS = ["workspace", "run", "job"]
JOB_GAUGES = (
    ("trainyard_job_cpu_percent", "CPU of the job's process tree, in percent of one core.", "cpu"),
    ("trainyard_job_memory_bytes", "Resident memory of the job's process tree.", "memory"),
)
GPU_GAUGES = (
    ("trainyard_job_gpu_utilization_percent", "Utilisation of each of the job's GPUs.", "util"),
    ("trainyard_job_gpu_memory_used_bytes", "Memory used on each of the job's GPUs.", "memory"),
    ("trainyard_job_gpu_memory_total_bytes", "Memory of each of the job's GPUs.", "memory_total"),
)


def _job_metrics() -> Iterable[Metric]:
    jobs = dangerously_all_workspaces_job_gauges()
    for name, text, series in JOB_GAUGES:
        family = GaugeMetricFamily(name, text, labels=JOB_LABELS)
        for job in jobs:
            if series in job.last:
                family.add_metric([job.workspace, job.run, job.job], job.last[series]["value"])
        yield family
    for name, text, metric in GPU_GAUGES:
        family = GaugeMetricFamily(name, text, labels=[*JOB_LABELS, "gpu"])
        for job in jobs:
            for series, entry in job.last.items():
                gpu, _, which = series.partition(".")
                if gpu.startswith("gpu") and gpu[3:].isdigit() and which == metric:
                    family.add_metric([job.workspace, job.run, job.job, gpu[3:]], entry["value"])
        yield family


def _cost_metrics() -> Iterable[Metric]:
    """What each workspace's running machines cost an hour (USD; docs/COST.md):
    a workspace with none has no series."""
    family = GaugeMetricFamily(
        "trainyard_running_cost_per_hour",
        "USD an hour: the summed price of the workspace's machines that are running (connected at least once).",
        labels=["workspace"],
    )
    for workspace, rate in sorted(dangerously_all_workspaces_cost_rates().items()):
        family.add_metric([workspace], float(rate))
    yield family


def _redis_metrics() -> Iterable[Metric]:
    yield CounterMetricFamily(
        "trainyard_log_lines", "Log lines stored (all jobs).", value=counters.counter("log_lines")
    )
    yield CounterMetricFamily(
        "trainyard_log_bytes", "Bytes of log output stored (all jobs).", value=counters.counter("log_bytes")
    )
    histogram = counters.provisioning_histogram()
    provisioning = HistogramMetricFamily(
        "trainyard_provisioning_seconds",
        "Time from a machine's launch being requested to its runner's first hello (self-hosted machines excluded).",
    )
    provisioning.add_metric(
        [], buckets=[(_le(bound), count) for bound, count in histogram.buckets], sum_value=histogram.total
    )
    yield provisioning
    connections = GaugeMetricFamily(
        "trainyard_websocket_connections", "Open websockets over all web processes.", labels=["kind"]
    )
    for kind, count in counters.connections_open().items():
        connections.add_metric([kind], count)
    yield connections


def _age(now: datetime, since: datetime | None) -> float:
    return max((now - since).total_seconds(), 0.0) if since is not None else 0.0


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


_REGISTRY = CollectorRegistry(auto_describe=False)
_REGISTRY.register(TrainyardCollector())

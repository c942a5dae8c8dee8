"""REST: a run's metrics per job, one job's series, runs compared (docs/API.md,
docs/METRICS.md). Members and viewers read them, as they read the run;
another workspace's run is not found (404)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.tenancy import WorkspaceAPIView
from backend.core.errors import ApplicationError, NotFound
from backend.metrics.selectors import (
    attempts_of,
    job_of_run,
    job_series,
    run_compared,
    run_for_metrics,
    run_metrics,
)
from backend.runs.models import run_ref_missing

DEFAULT_POINTS = 1000
MAX_POINTS = 5000
MAX_NAMES = 200
COMPARE_RUNS = (2, 10)
MAX_TIME = 1e11  # Unix seconds (the year 5138): any later is not a time a sample has


class MetricsAttemptOut(serializers.Serializer):
    number = serializers.IntegerField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    termination_reason = serializers.CharField()


class LastValueOut(serializers.Serializer):
    value = serializers.FloatField()
    step = serializers.IntegerField(allow_null=True)
    t = serializers.CharField(help_text="ISO 8601, UTC")
    attempt = serializers.IntegerField()


class JobMetricsOut(serializers.Serializer):
    job = serializers.CharField()
    attempts = MetricsAttemptOut(many=True)
    system = serializers.ListField(child=serializers.CharField(), help_text="cpu, memory, …, gpu0.util, …")
    training = serializers.ListField(child=serializers.CharField())
    last = serializers.DictField(child=LastValueOut(), help_text="each series' latest value")
    dropped = serializers.IntegerField(help_text="training values over the per-minute cap")
    malformed = serializers.IntegerField(help_text="lines of the metrics file skipped")
    frames_dropped = serializers.IntegerField(help_text="frames the server dropped (faster than its cap)")


class RunMetricsOut(serializers.Serializer):
    jobs = JobMetricsOut(many=True)


class MetricPointsOut(serializers.Serializer):
    x = serializers.ListField(child=serializers.FloatField(), help_text="step, or Unix seconds")
    y = serializers.ListField(child=serializers.FloatField(), help_text="the value (system: the mean)")
    min = serializers.ListField(child=serializers.FloatField(), required=False, help_text="system series")
    max = serializers.ListField(child=serializers.FloatField(), required=False, help_text="system series")
    attempt = serializers.ListField(child=serializers.IntegerField())
    t = serializers.ListField(
        child=serializers.FloatField(), required=False, help_text="training series: each value's Unix time"
    )


class MetricSeriesOut(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=["system", "training"])
    x = serializers.ChoiceField(choices=["step", "time"])
    unit = serializers.CharField()
    resolution = serializers.CharField(required=False, help_text='system series: "raw", "1m" or "<n>s"')
    points = MetricPointsOut()


class JobSeriesOut(serializers.Serializer):
    job = serializers.CharField()
    attempts = MetricsAttemptOut(many=True)
    series = MetricSeriesOut(many=True)


class ComparedSeriesOut(serializers.Serializer):
    name = serializers.CharField()
    job = serializers.CharField()
    x = serializers.ChoiceField(choices=["step", "time"])
    points = MetricPointsOut()


class ComparedRunOut(serializers.Serializer):
    run = serializers.CharField()
    workflow = serializers.CharField()
    status = serializers.CharField()
    commit = serializers.CharField()
    params = serializers.DictField(
        child=serializers.CharField(), help_text='"-e NAME": a digest of its value (values are secrets); "var NAME"'
    )
    cost = serializers.CharField(allow_null=True, help_text="USD, where the machines' prices are known")
    last = serializers.DictField(child=serializers.FloatField())
    series = ComparedSeriesOut(many=True)


class CompareOut(serializers.Serializer):
    runs = ComparedRunOut(many=True)


def _names(request: Request) -> list[str] | None:
    raw = request.query_params.get("names")
    if raw is None or not raw.strip():
        return None
    names = list(dict.fromkeys(name.strip() for name in raw.split(",") if name.strip()))
    if len(names) > MAX_NAMES:
        raise ApplicationError(f"names: at most {MAX_NAMES} series at once, not {len(names)}.")
    return names


def _number(request: Request, key: str, *, default: float | None = None) -> float | None:
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ApplicationError(f"{key}: {raw[:40]!r} is not a number (Unix seconds).") from None
    if not 0 <= value <= MAX_TIME:  # NaN too
        raise ApplicationError(f"{key}: {raw[:40]!r} is not a Unix time (seconds from 0 to {MAX_TIME:.0f}).")
    return value


def _points(request: Request) -> int:
    raw = request.query_params.get("points")
    if raw is None or raw == "":
        return DEFAULT_POINTS
    if not raw.isdigit() or not 2 <= int(raw) <= MAX_POINTS:
        raise ApplicationError(f"points: a whole number from 2 to {MAX_POINTS}, not {raw[:40]!r}.")
    return int(raw)


NAMES = OpenApiParameter("names", str, description="series names, comma-separated (default: every one)")
POINTS = OpenApiParameter(
    "points", int, description=f"most points per series (default {DEFAULT_POINTS}, at most {MAX_POINTS})"
)


class RunMetricsView(WorkspaceAPIView):
    """Each job's series names, last values and counters, and its attempts."""

    @extend_schema(responses=RunMetricsOut)
    def get(self, request: Request, workspace: str, run: str) -> Response:
        found = run_for_metrics(workspace=self.workspace, ref=run)
        if found is None:
            raise NotFound(run_ref_missing(run))
        return Response(RunMetricsOut({"jobs": run_metrics(found)}).data)


class JobSeriesView(WorkspaceAPIView):
    """One job's series over its attempts, downsampled to ``points`` each."""

    @extend_schema(
        responses=JobSeriesOut,
        parameters=[
            OpenApiParameter("job", str, required=True, description="the job's name"),
            NAMES,
            OpenApiParameter(
                "since", float, description="Unix seconds: points at or after (step series: by their time)"
            ),
            OpenApiParameter("until", float, description="Unix seconds: points at or before"),
            POINTS,
        ],
    )
    def get(self, request: Request, workspace: str, run: str) -> Response:
        found = run_for_metrics(workspace=self.workspace, ref=run)
        if found is None:
            raise NotFound(run_ref_missing(run))
        name = request.query_params.get("job", "")
        if not name:
            raise ApplicationError("job: the job's name is required (GET …/metrics/ lists them).")
        job = job_of_run(found, name)
        if job is None:
            raise NotFound(f"Run {found.name!r} has no job {name[:200]!r}.")
        series = job_series(
            job,
            names=_names(request),
            since=_number(request, "since"),
            until=_number(request, "until"),
            points=_points(request),
        )
        body: dict[str, Any] = {"job": job.name, "attempts": attempts_of(job), "series": series}
        return Response(JobSeriesOut(body).data)


class CompareView(WorkspaceAPIView):
    """2 to 10 runs of the workspace side by side: params, commit, cost, last values, curves."""

    @extend_schema(
        responses=CompareOut,
        parameters=[
            OpenApiParameter("runs", str, required=True, description="run names, comma-separated (2 to 10)"),
            NAMES,
            POINTS,
        ],
    )
    def get(self, request: Request, workspace: str) -> Response:
        refs = list(dict.fromkeys(r.strip() for r in request.query_params.get("runs", "").split(",") if r.strip()))
        low, high = COMPARE_RUNS
        if not low <= len(refs) <= high:
            raise ApplicationError(f"runs: {low} to {high} run names, comma-separated; got {len(refs)}.")
        runs = []
        for ref in refs:
            found = run_for_metrics(workspace=self.workspace, ref=ref)
            if found is None:
                raise NotFound(run_ref_missing(ref[:100]))
            runs.append(found)
        names, points, now = _names(request), _points(request), timezone.now()
        body = {"runs": [run_compared(run, names=names, points=points, now=now) for run in runs]}
        return Response(CompareOut(body).data)

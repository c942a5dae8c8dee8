"""The metrics' reads of the database: whole-installation aggregates, across
every workspace by design (an operator's view; no tenant's data leaves them
but counts). Each is one indexed query, cheap at scrape time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import Count, F, Max, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce, Greatest

from backend.billing.selectors import dangerously_all_workspaces_running_cost_per_hour
from backend.metrics.selectors import JobGauges, dangerously_all_workspaces_running_job_gauges
from backend.runs.models import Attempt, AttemptStatus, Job, JobStatus, Run, RunStatus

# A scrape that would wait longer on a busy database answers an error instead.
STATEMENT_TIMEOUT_MS = 2000


@dataclass(frozen=True)
class Gauges:
    runs_by_state: dict[str, int]
    pending_jobs: int
    oldest_ready_since: datetime | None  # the longest a schedulable job has waited
    oldest_heartbeat: datetime | None  # among instances running an attempt


def dangerously_all_workspaces_gauges() -> Gauges:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
        counts = dict(Run.objects.order_by().values_list("status").annotate(n=Count("id")))
        pending = Job.objects.filter(status=JobStatus.PENDING)
        heartbeat = Attempt.objects.filter(status=AttemptStatus.RUNNING).aggregate(
            oldest=Min("instance__last_heartbeat_at")
        )
        return Gauges(
            runs_by_state={state: counts.get(state, 0) for state in RunStatus.values},
            pending_jobs=pending.count(),
            oldest_ready_since=_schedulable(pending).aggregate(oldest=Min("ready_since"))["oldest"],
            oldest_heartbeat=heartbeat["oldest"],
        )


def dangerously_all_workspaces_job_gauges() -> list[JobGauges]:
    """Running jobs' latest system sample, under the same statement timeout."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
        return dangerously_all_workspaces_running_job_gauges()


def dangerously_all_workspaces_cost_rates() -> dict[str, Decimal]:
    """Each workspace's running machines' price per hour, under the same statement timeout."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
        return dangerously_all_workspaces_running_cost_per_hour()


def _schedulable(pending: QuerySet[Job]) -> QuerySet[Job]:
    """Pending jobs whose needs all succeeded, each with the moment it became
    ready to be scheduled: the latest of its creation, its needs' ends and
    its previous attempt's end (a retry waits from then, not from its submission)."""
    need_ended = Job.objects.filter(needed_by=OuterRef("pk")).order_by().values("needed_by")
    attempt_ended = Attempt.objects.filter(job=OuterRef("pk")).order_by().values("job")
    return (
        pending.exclude(Q(needs__status__in=[s for s in JobStatus.values if s != JobStatus.SUCCEEDED]))
        .annotate(
            needs_ended=Subquery(need_ended.annotate(at=Max("finished_at")).values("at")[:1]),
            attempt_ended=Subquery(attempt_ended.annotate(at=Max("finished_at")).values("at")[:1]),
        )
        .annotate(
            ready_since=Greatest(
                F("created_at"),
                Coalesce(F("needs_ended"), F("created_at")),
                Coalesce(F("attempt_ended"), F("created_at")),
            )
        )
    )

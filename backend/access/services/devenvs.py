"""Dev environments idle past their ``inactivity_duration`` are stopped
(docs/decisions/0104-dev-environments.md).

A running dev environment (``runs.lifecycle.devenvs``) is idle while no
session into it is live (granted, open or detached: an SSH or VS Code
connection, a terminal, a browser on its Jupyter through the app proxy) and
nothing was active for its ``inactivity_duration``, counted from the latest
of its current attempt's start, its sessions' last bytes, and its Jupyter's
last activity as its runner reports it (``Job.app_active_at``: a request, a
kernel message, a kernel busy; ``runs.services.devenvs``).

It is stopped as a person's stop is (checkpoint synced, its runner kills the
commands, its machine goes back to idle and is retired after its
``idle_duration``), with the reason ``stopped: idle for 1h
(inactivity_duration)``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import DateTimeField, Exists, ExpressionWrapper, F, IntegerField, Max, OuterRef, Subquery, Value
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Coalesce, Greatest
from django.utils import timezone

from backend.access.models import LIVE_SESSION, AccessSession
from backend.runs.lifecycle.devenvs import dev_environment_of
from backend.runs.lifecycle.transitions import job_request_stop
from backend.runs.models import Attempt, Job, JobStatus

# Dev environments looked at in one pass, those idle longest past their time first.
BATCH = 200


def dev_environments_stop_idle(*, now: datetime | None = None) -> int:
    """Stop the running dev environments idle past their
    ``inactivity_duration``, at most ``BATCH`` a pass; how many were stopped.

    1. in SQL: each running dev environment whose duration is not "off", its
       last activity (the latest of its attempt's start, its sessions'
       last bytes, ends or grants, and its Jupyter's), its deadline (that plus its duration or
       the default); those with no live session and a deadline passed,
       oldest deadline first;
    2. each is looked at again just before it is stopped (a session may
       have been granted since) and stopped with its reason.
    """
    now = now or timezone.now()
    stopped = 0
    for job in _idle(now):
        if _has_live_session(job):
            continue
        found = dev_environment_of(job.spec)
        if found is None or found.inactivity_seconds is None:
            continue
        reason = f"stopped: idle for {found.idle_words()} (inactivity_duration)"
        stopped += job_request_stop(job=job, reason=reason)
    return stopped


def _idle(now: datetime) -> list[Job]:
    sessions = AccessSession.objects.filter(job=OuterRef("pk")).order_by()
    session_activity = sessions.values("job").annotate(
        at=Max(Coalesce("last_activity_at", "ended_at", "started_at", "created_at"))
    )
    attempt_start = Attempt.objects.filter(job=OuterRef("pk"), number=OuterRef("attempt")).values("started_at")
    seconds = Cast(KeyTextTransform("inactivity_duration", KeyTransform("dev_environment", "spec")), IntegerField())
    default = int(settings.TRAINYARD["DEV_INACTIVITY_SECONDS"])
    rows = (
        Job.objects.filter(status=JobStatus.RUNNING, spec__has_key="dev_environment")
        .exclude(spec__dev_environment__inactivity_duration="off")
        .annotate(
            live=Exists(sessions.filter(state__in=LIVE_SESSION)),
            # Postgres' GREATEST skips nulls: no session, no report from Jupyter.
            active_at=Greatest(
                Coalesce(Subquery(attempt_start), "started_at"),
                Subquery(session_activity.values("at")),
                "app_active_at",
            ),
            idle_seconds=Coalesce(seconds, Value(default)),
        )
        .annotate(
            deadline=ExpressionWrapper(
                F("active_at") + F("idle_seconds") * Value(timedelta(seconds=1)), output_field=DateTimeField()
            )
        )
        .filter(live=False, deadline__lte=now)
        .order_by("deadline")
    )
    return list(rows[:BATCH])


def _has_live_session(job: Job) -> bool:
    return AccessSession.objects.filter(job=job, state__in=LIVE_SESSION).exists()

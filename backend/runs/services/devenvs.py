"""A dev environment's activity as its runner reports it: how long ago its
Jupyter last saw a request, a kernel message or a busy kernel
(``Heartbeat.app_idle_seconds``; the runner's ``appwatch``). The idle rule
(``backend.access.services.devenvs``) counts it beside sessions."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from django.db.models import Q
from django.db.models.functions import Now

from backend.runs.models import Job, JobStatus


def dev_environment_active(*, instance_id: UUID | str, idle_seconds: float) -> int:
    """The running dev environment on ``instance_id`` was active
    ``idle_seconds`` ago (the database's clock minus that); a later report
    only moves it forward. How many jobs it changed (0 or 1)."""
    at = Now() - timedelta(seconds=idle_seconds)
    jobs = Job.objects.filter(instance_id=instance_id, status=JobStatus.RUNNING, spec__has_key="dev_environment")
    return jobs.filter(Q(app_active_at__isnull=True) | Q(app_active_at__lt=at)).update(app_active_at=at)

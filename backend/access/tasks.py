"""Periodic work of sessions into jobs and dev environments, from the beat."""

from __future__ import annotations

from celery import shared_task

from backend.access.services.devenvs import dev_environments_stop_idle
from backend.access.services.sweep import sessions_sweep as sessions_sweep_pass


@shared_task(acks_late=True, time_limit=120, soft_time_limit=100, expires=60)
def dev_environments_idle() -> int:
    """Dev environments idle past their ``inactivity_duration`` are stopped; bounded per call."""
    return dev_environments_stop_idle()


@shared_task(acks_late=True, time_limit=60, soft_time_limit=50, expires=30)
def sessions_sweep() -> int:
    """Unused grants, terminals not back within the grace, idle sessions
    (``services.sweep``); idempotent: a session ends once (``end_session``)."""
    return sessions_sweep_pass()

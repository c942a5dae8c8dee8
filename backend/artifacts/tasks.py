"""Celery tasks of stored bytes: the periodic garbage collection
(``storage-gc`` in settings.CELERY_BEAT_SCHEDULE), the copies of artifacts
to a workflow's ``to:`` and their sweep (``artifact-exports-sweep``)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from backend.artifacts.exports import ATTEMPT_SECONDS, export_attempt, exports_due
from backend.artifacts.gc import storage_gc as storage_gc_pass


@shared_task(acks_late=True, time_limit=1800, soft_time_limit=1700, expires=3600)
def storage_gc() -> str:
    """One pass of backend.artifacts.gc; idempotent (a second run finds nothing more)."""
    return str(storage_gc_pass(grace_seconds=settings.TRAINYARD["GC_GRACE_SECONDS"]))


@shared_task(acks_late=True, time_limit=ATTEMPT_SECONDS, soft_time_limit=ATTEMPT_SECONDS - 60)
def artifact_export(export_id: str) -> str:
    """One attempt at an export if it is due (a duplicate message finds it claimed and does nothing)."""
    return export_attempt(export_id=export_id)


@shared_task(acks_late=True, time_limit=120, soft_time_limit=100, expires=300)
def artifact_exports_sweep() -> str:
    """Send the exports that are due: retries, and those a dead worker held."""
    return f"sent {len(exports_due())}"

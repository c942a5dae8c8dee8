"""Celery tasks of stored bytes: the periodic garbage collection
(``storage-gc`` in settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from backend.artifacts.gc import storage_gc as storage_gc_pass


@shared_task(acks_late=True, time_limit=1800, soft_time_limit=1700, expires=3600)
def storage_gc() -> str:
    """One pass of backend.artifacts.gc; idempotent (a second run finds nothing more)."""
    return str(storage_gc_pass(grace_seconds=settings.TRAINYARD["GC_GRACE_SECONDS"]))

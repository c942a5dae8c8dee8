"""Periodic work on data inputs, declared in settings' CELERY_BEAT_SCHEDULE."""

from __future__ import annotations

from celery import shared_task

from backend.data.services import snapshots_prune as snapshots_prune_service


@shared_task(acks_late=True, time_limit=300, soft_time_limit=270, expires=3600)
def snapshots_prune() -> int:
    """Snapshots no job names, unused for a day, hourly from the beat; bounded per call."""
    return snapshots_prune_service()

"""Periodic work of the metrics, from the beat."""

from __future__ import annotations

from celery import shared_task

from backend.metrics.services.compact import metrics_compact as metrics_compact_pass


@shared_task(acks_late=True, time_limit=120, soft_time_limit=100, expires=60)
def metrics_compact() -> int:
    """Frames packed into blocks, old hours downsampled to minutes (``services.compact``); bounded per call."""
    return metrics_compact_pass()

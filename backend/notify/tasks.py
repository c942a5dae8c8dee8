"""The notify app's Celery tasks: thin wrappers over its services."""

from __future__ import annotations

from celery import shared_task

from backend.notify.services import deliveries_sweep as sweep
from backend.notify.services import delivery_send as send

# A send waits at most its timeout for the receiver (TRAINYARD_NOTIFY_TIMEOUT_SECONDS).
SEND_TIME_LIMIT = 120


@shared_task(acks_late=True, time_limit=SEND_TIME_LIMIT + 30, soft_time_limit=SEND_TIME_LIMIT)
def delivery_send(delivery_id: str) -> str:
    """One delivery, if it is due and pending; the sweep finds any this misses."""
    return send(delivery_id=delivery_id)


@shared_task(acks_late=True, time_limit=90, soft_time_limit=60, expires=300)
def deliveries_sweep() -> int:
    """Queue the due deliveries, from the beat."""
    return sweep()

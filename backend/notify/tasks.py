"""The notify app's Celery tasks: thin wrappers over its services."""

from __future__ import annotations

from celery import shared_task

from backend.notify.services import SEND_TIME_LIMIT
from backend.notify.services import deliveries_sweep as sweep
from backend.notify.services import delivery_send as send
from backend.notify.services import disabled_notice_send as disabled_notice

# A send waits at most TRAINYARD_NOTIFY_TIMEOUT_SECONDS for each step of its
# receiver; SEND_TIME_LIMIT bounds the whole send (and its claim's lease).


@shared_task(acks_late=True, time_limit=SEND_TIME_LIMIT + 30, soft_time_limit=SEND_TIME_LIMIT)
def delivery_send(delivery_id: str) -> str:
    """One delivery, if it is due and pending; the sweep finds any this misses."""
    return send(delivery_id=delivery_id)


@shared_task(acks_late=True, time_limit=90, soft_time_limit=60, expires=300)
def deliveries_sweep() -> int:
    """Queue the due deliveries, from the beat."""
    return sweep()


@shared_task(acks_late=True, time_limit=SEND_TIME_LIMIT + 30, soft_time_limit=SEND_TIME_LIMIT)
def disabled_notice_send(subscription_id: str) -> int:
    """Email the workspace's admins that a failing subscription was disabled."""
    return disabled_notice(subscription_id=subscription_id)

"""Celery tasks: thin wrappers that call one service each.

Tasks take ids only (or nothing), are idempotent and safe to run twice.
"""

from __future__ import annotations

from celery import shared_task

from backend.runs.services.reconcile import reconcile as reconcile_service
from backend.runs.services.scheduling import jobs_schedule


@shared_task(acks_late=True, time_limit=60, soft_time_limit=50)
def schedule() -> dict[str, int]:
    result = jobs_schedule()
    return {"assigned": len(result.assigned), "provisioned": len(result.provisioned), "waiting": len(result.waiting)}


@shared_task(acks_late=True, time_limit=60, soft_time_limit=50, expires=10)
def reconcile() -> None:
    if reconcile_service():
        jobs_schedule()

"""The per-account tasks a reconcile pass queued (``backend.clouds.tasks.account_reconcile``),
run in this process as a worker would run them: taken off the broker's real
Redis queue and executed. For tests that call the reconciler directly and
look at what the cloud calls decided."""

from __future__ import annotations

import base64
import json

from backend.clouds import tasks
from backend.core.redis import redis_client
from backend.runs.services.reconcile import reconcile

QUEUE = "celery"  # Celery's default queue: a list in the broker's Redis
TASK = "backend.clouds.tasks.account_reconcile"


def run_account_tasks() -> int:
    """Take every queued account task off the queue and run it; returns how
    many machines they changed."""
    client = redis_client()
    changed = 0
    for raw in client.lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] != TASK or not client.lrem(QUEUE, 1, raw):
            continue
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        changed += tasks.account_reconcile(*args, **kwargs)
    return changed


def reconcile_with_account_tasks() -> bool:
    """A reconcile pass, the account tasks it queued, and (when they changed
    a machine) the next pass, which ends the work on what they fenced."""
    changed = reconcile()
    if run_account_tasks():
        changed = reconcile() or changed
    return changed

"""The Celery app: broker from settings, tasks discovered from the apps,
all of them ``GuardedTask``s (backend/core/deliveries.py)."""

from __future__ import annotations

import gc
import os

from celery import Celery
from celery.signals import worker_init

from backend.core import kombu_redis

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backend.config.settings")

# The worker survives the broker going away with tasks unacked (kombu_redis.py).
kombu_redis.patch()

# Every task counts its deliveries and is parked after too many worker deaths.
app = Celery("trainyard", task_cls="backend.core.deliveries:GuardedTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _warm_before_the_pool_forks(**_: object) -> None:
    """In the worker's parent, before the pool is forked: the backends'
    SDK data is loaded once (``backends_warm``) and shared by every pool
    process. Then everything loaded so far is frozen out of the garbage
    collector: a full collection would otherwise walk botocore's models
    (~90 ms) in every process, and touching them copies their pages."""
    from backend.clouds.services.accounts import backends_warm  # the apps are ready only now

    backends_warm()
    gc.freeze()

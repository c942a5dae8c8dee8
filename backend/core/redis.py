"""One Redis client per process for the server's own keys (not the channel
layer's, not Celery's): delivery counts, the scheduler's dirty flag."""

from __future__ import annotations

import functools

import redis
from django.conf import settings

# Every command answers in well under a second; a Redis that stops answering
# must not hang a worker or a request.
SOCKET_TIMEOUT_SECONDS = 5.0


@functools.cache
def redis_client() -> redis.Redis:
    """Safe after a fork: redis-py's pool opens new connections in a child."""
    return redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=SOCKET_TIMEOUT_SECONDS, socket_connect_timeout=SOCKET_TIMEOUT_SECONDS
    )

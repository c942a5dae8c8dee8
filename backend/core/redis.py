"""One Redis client per process for the server's own keys (not the channel
layer's, not Celery's): delivery counts, the scheduler's dirty flag, rate
limits, counters."""

from __future__ import annotations

import threading

import redis
from django.conf import settings

# Every command answers in well under a second; a Redis that stops answering
# must not hang a worker or a request.
SOCKET_TIMEOUT_SECONDS = 5.0

_made: dict[tuple[str, float, bool], redis.Redis] = {}
_making = threading.Lock()


def shared_client(url: str, *, timeout: float, decode_responses: bool = False) -> redis.Redis:
    """The process's one client for ``url`` with these options, made once
    under a lock. Not ``functools.cache``: two requests' threads that asked
    at once each made a client, the cache kept one, and the other, collected
    later, closed its connection pool (``Redis.__del__``) under the thread
    still using it: a 500 with "I/O operation on closed file" in the
    50-run burst. Safe after a fork: redis-py's pool opens new connections
    in a child."""
    key = (url, timeout, decode_responses)
    client = _made.get(key)
    if client is None:
        with _making:
            client = _made.get(key)
            if client is None:
                client = _made[key] = redis.Redis.from_url(
                    url, socket_timeout=timeout, socket_connect_timeout=timeout, decode_responses=decode_responses
                )
    return client


def redis_client() -> redis.Redis:
    return shared_client(settings.REDIS_URL, timeout=SOCKET_TIMEOUT_SECONDS)

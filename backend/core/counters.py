"""Metrics that every web and worker process adds to, kept in Redis.

A scrape of ``/metrics`` reaches one process behind the load balancer, so no
value may live in one process's memory (docs/decisions/0048-metrics-in-shared-stores.md):

- counters (log lines and bytes ingested) are ``INCRBY``s on shared keys;
- the provisioning-latency histogram is one hash of cumulative buckets;
- open websockets are counted per process in memory and published by each
  web process under its own key, which expires if the process dies
  (``connections_publish``), so a crashed process's sockets drop out.

Writes are best effort: a Redis that fails or stops answering costs a lost
increment, never a log batch or a runner's hello. After a failure, writes are
skipped for ``BACKOFF_SECONDS`` rather than each waiting for a timeout.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from django.conf import settings
from redis.client import Pipeline

from backend.core.redis import shared_client

logger = logging.getLogger(__name__)

TIMEOUT_SECONDS = 0.5
BACKOFF_SECONDS = 5.0
# Provisioning latency (launch requested -> runner connected), seconds.
PROVISIONING_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
CONNECTION_KINDS = ("runner", "follower")
# A web process rewrites its connection counts at least this often; they expire after CONNECTIONS_TTL.
CONNECTIONS_REFRESH_SECONDS = 10.0
CONNECTIONS_TTL_SECONDS = 30

_down_until = 0.0
_open: dict[str, int] = dict.fromkeys(CONNECTION_KINDS, 0)


@dataclass(frozen=True)
class Histogram:
    buckets: list[tuple[float, int]]  # (upper bound, cumulative count), +Inf last
    count: int
    total: float


def log_ingested(*, lines: int, size: int) -> None:
    """Count stored log lines and their bytes (call after the commit)."""

    def commands(pipe: Pipeline) -> None:
        pipe.incrby(_key("log_lines"), lines)
        pipe.incrby(_key("log_bytes"), size)

    _write(commands)


def provisioning_observe(seconds: float) -> None:
    """One machine's time from launch requested to its runner's first hello."""
    key = _key("provisioning")

    def commands(pipe: Pipeline) -> None:
        for bound in PROVISIONING_BUCKETS:
            if seconds <= bound:
                pipe.hincrby(key, repr(bound), 1)
        pipe.hincrby(key, "count", 1)
        pipe.hincrbyfloat(key, "sum", seconds)

    _write(commands)


def connection_opened(kind: str) -> None:
    _open[kind] += 1


def connection_closed(kind: str) -> None:
    _open[kind] -= 1


def connections_publish() -> None:
    """Write this process's open connections under its own expiring key."""
    key = _key(f"ws:{_process()}")

    def commands(pipe: Pipeline) -> None:
        for kind, count in list(_open.items()):
            pipe.hset(key, kind, count)
        pipe.expire(key, CONNECTIONS_TTL_SECONDS)

    _write(commands)


# ----------------------------------------------------------------- reading


def counter(name: str) -> int:
    """A counter's value (0 when never written); raises on a Redis error."""
    raw = _client().get(_key(name))
    return int(raw) if raw is not None else 0


def provisioning_histogram() -> Histogram:
    raw = {str(k): str(v) for k, v in _client().hgetall(_key("provisioning")).items()}
    count = int(raw.get("count", 0))
    buckets = [(bound, int(raw.get(repr(bound), 0))) for bound in PROVISIONING_BUCKETS]
    return Histogram(buckets=[*buckets, (float("inf"), count)], count=count, total=float(raw.get("sum", 0.0)))


def connections_open() -> dict[str, int]:
    """Open websockets by kind, summed over the web processes alive now."""
    client = _client()
    totals = dict.fromkeys(CONNECTION_KINDS, 0)
    for key in client.scan_iter(match=_key("ws:*"), count=100):
        for kind, value in client.hgetall(key).items():
            if str(kind) in totals:
                totals[str(kind)] += int(value)
    return totals


# ----------------------------------------------------------------- helpers


def _write(commands: Callable[[Pipeline], None]) -> None:
    """Run ``commands`` in one round trip, unless Redis failed recently;
    a Redis error is logged and starts the back-off."""
    global _down_until
    if time.monotonic() < _down_until:
        return
    try:
        pipe = _client().pipeline(transaction=False)
        commands(pipe)
        pipe.execute()
    except redis.RedisError as exc:
        _down_until = time.monotonic() + BACKOFF_SECONDS
        logger.warning("metrics: Redis unavailable, counts are skipped for %.0f s: %s", BACKOFF_SECONDS, exc)


def _key(name: str) -> str:
    return f"{settings.METRICS_PREFIX}:{name}"


@functools.cache
def _process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _client() -> redis.Redis:
    """Its own client with short timeouts: metrics never hold up real work."""
    return shared_client(settings.REDIS_URL, timeout=TIMEOUT_SECONDS, decode_responses=True)

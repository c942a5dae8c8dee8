"""Rate limits: fixed-window counters in Redis, shared by every web process.

A hit on (scope, kind, identity) increments the key of the current window
and sets its expiry in one MULTI/EXEC, so concurrent hits from any number of
processes count exactly; the count is over the limit → refused, with the
seconds until the window ends. ``kind`` is ``user`` or ``ip``; the limits
are ``settings.TRAINYARD["RATE_LIMITS"][scope][kind]`` as (hits, seconds) or
None (no limit). See docs/decisions/0038-rate-limits.md.

If Redis cannot be reached the hit is allowed and a warning logged: a
limiter must not lock everybody out of signing in (the channel layer and
Celery need Redis anyway, so the outage is noticed).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

from backend.core.redis import shared_client

logger = logging.getLogger(__name__)

REDIS_TIMEOUT_SECONDS = 1.0
SCOPE_WORDS = {
    "login": "sign-in attempts",
    "token": "API tokens made",
    "device": "browser sign-ins and device codes tried",
    "run": "runs submitted",
    "blob": "uploads",
    "plan": "plans asked for",
    "logsearch": "log searches",
    "rawlog": "raw log reads",
    "archive": "artifact archives",
    "ws": "websocket connections",
    "runner": "runner connections",
}


@dataclass(frozen=True)
class Refusal:
    """A hit over its limit: what to tell the caller."""

    scope: str
    kind: str  # "user" or "ip"
    limit: int
    period_seconds: int
    retry_after: int  # whole seconds, at least 1

    @property
    def message(self) -> str:
        who = "this account" if self.kind == "user" else "this address"
        return (
            f"Too many {SCOPE_WORDS.get(self.scope, 'requests')} from {who}: at most {self.limit} per"
            f" {period_words(self.period_seconds)}. Try again in {self.retry_after} s."
        )

    @property
    def extra(self) -> dict[str, object]:
        return {
            "scope": self.scope,
            "per": self.kind,
            "limit": self.limit,
            "period_seconds": self.period_seconds,
            "retry_after_seconds": self.retry_after,
        }


def rate_hit(*, scope: str, kind: str, identity: str) -> Refusal | None:
    """Count one hit; the refusal when it is over the limit, else None."""
    rate = settings.TRAINYARD["RATE_LIMITS"].get(scope, {}).get(kind)
    if rate is None or not identity:
        return None
    limit, period = rate
    now = time.time()
    window = int(now // period)
    key = _key(scope, kind, identity, window)
    try:
        pipe = _client(settings.REDIS_URL).pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, 2 * period + 1)  # read as the previous window during the next one
        pipe.get(_key(scope, kind, identity, window - 1))
        count, _, previous = pipe.execute()
    except redis.RedisError as exc:
        logger.warning("rate limit %s/%s not counted (Redis: %s): allowed", scope, kind, exc)
        return None
    return _judge(scope, kind, limit, period, now, int(count), int(previous or 0))


def rate_over(*, scope: str, kind: str, identity: str) -> Refusal | None:
    """Whether ``identity`` is over the limit already, without counting a hit."""
    rate = settings.TRAINYARD["RATE_LIMITS"].get(scope, {}).get(kind)
    if rate is None or not identity:
        return None
    limit, period = rate
    now = time.time()
    window = int(now // period)
    try:
        current, previous = _client(settings.REDIS_URL).mget(
            [_key(scope, kind, identity, window), _key(scope, kind, identity, window - 1)]
        )
    except redis.RedisError as exc:
        logger.warning("rate limit %s/%s not read (Redis: %s): allowed", scope, kind, exc)
        return None
    return _judge(scope, kind, limit, period, now, int(current or 0), int(previous or 0))


def _judge(scope: str, kind: str, limit: int, period: int, now: float, current: int, previous: int) -> Refusal | None:
    """Sliding window: the hits of the current window plus the previous
    window's, weighted by how much of it still lies within one period of now."""
    elapsed = (now % period) / period
    if current + previous * (1 - elapsed) <= limit:
        return None
    if current > limit:  # even without the previous window: until enough of this one slides out too
        wait = (1 - elapsed) * period + period * (1 - limit / current)
    else:  # until enough of the previous window has slid out
        wait = period * (1 - (limit - current) / previous) - elapsed * period
    # Every hit counted now is more than a period old after one period: never longer.
    return Refusal(scope, kind, limit, period, max(1, math.ceil(min(wait, period))))


def _key(scope: str, kind: str, identity: str, window: int) -> str:
    # Hashed: an identity may be a username someone typed (any bytes, any length).
    digest = hashlib.sha256(identity.encode()).hexdigest()[:32]
    return f"{settings.TRAINYARD['RATE_LIMIT_PREFIX']}:{scope}:{kind}:{digest}:{window}"


def _client(url: str) -> redis.Redis:
    return shared_client(url, timeout=REDIS_TIMEOUT_SECONDS)


def client_ip(request: Any) -> str:
    """The client's address: ``REMOTE_ADDR`` only, never a header the client
    sets (behind a proxy the ASGI server resolves it, for trusted proxies only)."""
    return str(request.META.get("REMOTE_ADDR") or "")


def period_words(seconds: int) -> str:
    """``minute``, ``15 minutes``, ``hour``, ``90 seconds``."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return unit if count == 1 else f"{count} {unit}s"
    return f"{seconds} seconds"

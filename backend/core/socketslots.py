"""How many browser and CLI websockets a user has open, counted in Redis by
every web process together (docs/decisions/0087-websocket-slots.md).

Each open socket holds a slot: a member of the user's sorted set whose score
is when it expires, by Redis's own clock (the web hosts' clocks never
compare). Taking a slot drops the expired ones, counts the rest and adds one
if the count is under the limit, in one script, so concurrent connects from
any number of processes never pass the limit together. An open socket
renews its slot at each re-check (consumers/watch.py) and gives it back on
disconnect; a process that dies holding slots loses them when they expire,
``SLOT_RENEWALS`` re-checks later.

If Redis cannot be reached the socket is let in and a warning logged, as
the rate limits do (``backend.core.ratelimit``).
"""

from __future__ import annotations

import logging

import redis
from django.conf import settings

from backend.core.redis import shared_client

logger = logging.getLogger(__name__)

REDIS_TIMEOUT_SECONDS = 1.0
# A slot lives this many re-check intervals unless renewed.
SLOT_RENEWALS = 3

_TAKE = """
local now = redis.call('TIME')
local at = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', at)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[2]) then return held end
redis.call('ZADD', KEYS[1], at + tonumber(ARGV[3]), ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 1)
return -1
"""
_RENEW = """
local now = redis.call('TIME')
local at = tonumber(now[1]) + tonumber(now[2]) / 1000000
local renewed = redis.call('ZADD', KEYS[1], 'XX', 'CH', at + tonumber(ARGV[2]), ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
return renewed
"""


def socket_slot_take(*, user_id: object, slot: str, lifetime: float) -> int | None:
    """Take ``slot`` for ``user_id``'s new socket, for ``lifetime`` seconds
    unless renewed. None: taken (or no limit, or Redis unreachable); else
    the limit the user is at, and the socket must be refused."""
    limit = settings.TRAINYARD["WS_PER_USER"]
    if not limit:
        return None
    try:
        held = _client().eval(_TAKE, 1, _key(user_id), slot, limit, lifetime)
    except redis.RedisError as exc:
        logger.warning("websocket slot of user %s not counted (Redis: %s): allowed", user_id, exc)
        return None
    return None if int(held) < 0 else int(limit)


def socket_slot_renew(*, user_id: object, slot: str, lifetime: float) -> None:
    """Push ``slot``'s expiry ``lifetime`` seconds ahead (a slot that expired meanwhile is not taken again)."""
    try:
        _client().eval(_RENEW, 1, _key(user_id), slot, lifetime)
    except redis.RedisError as exc:
        logger.warning("websocket slot of user %s not renewed (Redis: %s)", user_id, exc)


def socket_slot_release(*, user_id: object, slot: str) -> None:
    try:
        _client().zrem(_key(user_id), slot)
    except redis.RedisError as exc:
        logger.warning("websocket slot of user %s not given back (Redis: %s): it expires", user_id, exc)


def _key(user_id: object) -> str:
    return f"{settings.TRAINYARD['RATE_LIMIT_PREFIX']}:sockets:user:{user_id}"


def _client() -> redis.Redis:
    return shared_client(settings.REDIS_URL, timeout=REDIS_TIMEOUT_SECONDS)

"""Sign-in lockouts: wrong passwords lock a username, or an address, out.

``TRAINYARD_LOGIN_LOCKOUT_USER`` wrong passwords for one username (from any
addresses) within its period (5 in 15 minutes) lock that username out of
password sign-in for ``TRAINYARD_LOGIN_LOCKOUT_SECONDS`` (15 minutes);
``TRAINYARD_LOGIN_LOCKOUT_IP`` wrong passwords from one address (for any
usernames) lock that address out. While locked, every password sign-in of it
is refused before the password is checked, the right one too. See
docs/decisions/0080-sign-in-lockout.md.

Every password check of ``LocalLoginBackend`` (the API's login and the Django
admin's) goes through here:

1. ``sign_in_attempt``: refused if an active ``SignInLockout`` names the
   username or the address; else the attempt is counted, before the password
   is checked, in an exact sliding log per username and per address (a Redis
   sorted set of attempt ids scored by time, trimmed to the period, in one
   MULTI/EXEC). Counting first bounds guesses sent in parallel too: past the
   limit an attempt is refused although the ones before it are still in flight.
2. ``sign_in_succeeded``: the attempt is taken out of the logs again, so only
   wrong passwords stay counted.
3. ``sign_in_failed``: a log holding the limit starts a lockout (a row, which
   admins see in the Django admin) and is emptied: after the lockout the count
   starts again.

If Redis cannot be reached the attempt is not counted (logged), as the rate
limits do (decision 0038); lockouts already begun still hold (they are rows).
``clock`` is the time every decision here reads: tests set their own.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import redis
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from backend.accounts.models import LockoutPer, SignInLockout
from backend.core.ratelimit import Refusal, period_words
from backend.core.redis import shared_client

logger = logging.getLogger(__name__)

REDIS_TIMEOUT_SECONDS = 1.0
# Ended lockouts are kept this long, as a record admins can read.
LOCKOUT_RECORDS_KEPT = timedelta(days=30)
SCOPE = "lockout"

clock: Callable[[], float] = time.time


@dataclass(frozen=True)
class LockedOut(Refusal):
    """A refused sign-in: who is locked out (``kind``: ``user`` or ``ip``), after how many
    wrong passwords (``limit``) in how long (``period_seconds``), and until when."""

    locked_until: datetime

    @property
    def message(self) -> str:
        who = "this account" if self.kind == "user" else "this address"
        return (
            f"Too many wrong passwords for {who} ({self.limit} within {period_words(self.period_seconds)}):"
            f" password sign-in is locked until {self.locked_until:%H:%M:%S} UTC. Try again in {self.retry_after} s."
        )

    @property
    def extra(self) -> dict[str, object]:
        return {**super().extra, "locked_until": self.locked_until.isoformat()}


class SignInLocked(PermissionDenied):
    """Raised by the authentication backend: Django's ``authenticate()`` stops at it
    (and answers None); ``lockout_of(request)`` tells the view why."""

    def __init__(self, refusal: LockedOut) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@dataclass(frozen=True)
class _Log:
    kind: str  # "user" or "ip"
    identity: str
    limit: int
    period: int

    @property
    def key(self) -> str:
        # Hashed: a username is whatever someone typed.
        digest = hashlib.sha256(self.identity.encode()).hexdigest()[:32]
        return f"{settings.TRAINYARD['RATE_LIMIT_PREFIX']}:{SCOPE}:{self.kind}:{digest}"


@dataclass
class Attempt:
    """One password check under way: the logs it is counted in, as ``member``."""

    username: str
    address: str
    member: str = field(default_factory=lambda: secrets.token_hex(8))
    logs: list[_Log] = field(default_factory=list)


# Where the backend leaves the refusal on the request, for the view (``lockout_of``).
_REQUEST_ATTRIBUTE = "trainyard_sign_in_locked"


def note_lockout(request: HttpRequest, refusal: LockedOut) -> None:
    """Remember why ``authenticate()`` answered None for this request (see ``lockout_of``)."""
    setattr(request, _REQUEST_ATTRIBUTE, refusal)


def lockout_of(request: HttpRequest) -> LockedOut | None:
    """The lockout that refused this request's password sign-in, if one did."""
    refusal = getattr(request, _REQUEST_ATTRIBUTE, None)
    return refusal if isinstance(refusal, LockedOut) else None


def normal_username(username: str) -> str:
    """What a username is counted and locked as: ``Admin`` and `` admin`` are ``admin``."""
    return username.strip().lower()[:150]


def sign_in_attempt(*, username: str, address: str) -> Attempt:
    """Count a password check about to happen; ``SignInLocked`` if the username or the
    address is locked out, or if this attempt is past the limit."""
    now = clock()
    attempt = Attempt(username=normal_username(username), address=address[:64])
    locked = _active_lockout(attempt, now)
    if locked is not None:
        raise SignInLocked(locked)
    attempt.logs = _logs(attempt)
    if not attempt.logs:
        return attempt
    try:
        pipe = _client().pipeline(transaction=True)
        for log in attempt.logs:
            pipe.zremrangebyscore(log.key, "-inf", now - log.period)
            pipe.zadd(log.key, {attempt.member: now})
            pipe.zcard(log.key)
            pipe.zrange(log.key, 0, 0, withscores=True)
            pipe.expire(log.key, log.period + 1)
        answers = pipe.execute()
    except redis.RedisError as exc:
        logger.warning("sign-in attempt of %r not counted (Redis: %s): allowed", attempt.username, exc)
        attempt.logs = []
        return attempt
    for index, log in enumerate(attempt.logs):
        count, oldest = int(answers[5 * index + 2]), answers[5 * index + 3]
        if count > log.limit:  # attempts before it are still in flight: wait for the oldest to slide out
            sign_in_succeeded(attempt)  # not counted
            oldest_at = float(oldest[0][1]) if oldest else now
            raise SignInLocked(_refusal(log, _datetime(max(now + 1, oldest_at + log.period)), now))
    return attempt


def sign_in_succeeded(attempt: Attempt) -> None:
    """The password was right: the attempt is no longer counted."""
    if not attempt.logs:
        return
    try:
        pipe = _client().pipeline(transaction=True)
        for log in attempt.logs:
            pipe.zrem(log.key, attempt.member)
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("sign-in attempt of %r not taken back (Redis: %s)", attempt.username, exc)


def sign_in_failed(attempt: Attempt) -> list[SignInLockout]:
    """The password was wrong (it stays counted): the lockouts this failure started."""
    if not attempt.logs:
        return []
    now = clock()
    try:
        pipe = _client().pipeline(transaction=True)
        for log in attempt.logs:
            pipe.zremrangebyscore(log.key, "-inf", now - log.period)
            pipe.zcard(log.key)
        answers = pipe.execute()
    except redis.RedisError as exc:
        logger.warning("sign-in failure of %r not judged (Redis: %s)", attempt.username, exc)
        return []
    full = [(log, int(answers[2 * index + 1])) for index, log in enumerate(attempt.logs)]
    full = [(log, count) for log, count in full if count >= log.limit]
    if not full:
        return []
    until = _datetime(now + settings.TRAINYARD["LOGIN_LOCKOUT_SECONDS"])
    started = [
        SignInLockout.objects.create(
            per=log.kind,
            identity=log.identity,
            failures=count,
            locked_until=until,
            last_username=attempt.username,
            last_address=attempt.address,
        )
        for log, count in full
    ]
    for log, count in full:
        logger.warning("sign-in locked: %s %r after %d wrong passwords, until %s", log.kind, log.identity, count, until)
    try:
        _client().delete(*(log.key for log, _ in full))
    except redis.RedisError as exc:
        logger.warning("sign-in failure logs not emptied (Redis: %s)", exc)
    SignInLockout.objects.filter(locked_until__lt=_datetime(now) - LOCKOUT_RECORDS_KEPT).delete()
    return started


def lockout_now() -> datetime:
    """Now, as the lockouts see it (``clock``)."""
    return _datetime(clock())


def lockouts_end(rows: QuerySet[SignInLockout]) -> int:
    """End now those of ``rows`` still active; how many there were."""
    now = lockout_now()
    return rows.filter(locked_until__gt=now).update(locked_until=now)


def lockouts_lift(*, identity: str) -> int:
    """End now every active lockout of a username or an address; how many there were."""
    return lockouts_end(SignInLockout.objects.filter(identity__in={identity.strip(), normal_username(identity)}))


def _active_lockout(attempt: Attempt, now: float) -> LockedOut | None:
    """The active lockout of the attempt's username or address that ends last."""
    named = Q(per=LockoutPer.USERNAME, identity=attempt.username)
    if attempt.address:
        named |= Q(per=LockoutPer.ADDRESS, identity=attempt.address)
    row = SignInLockout.objects.filter(named, locked_until__gt=_datetime(now)).order_by("-locked_until").first()
    if row is None:
        return None
    limit, period = _rate(row.per) or (row.failures, settings.TRAINYARD["LOGIN_LOCKOUT_SECONDS"])
    log = _Log(kind=row.per, identity=row.identity, limit=limit, period=period)
    return _refusal(log, row.locked_until, now)


def _logs(attempt: Attempt) -> list[_Log]:
    logs = []
    for kind, identity in ((LockoutPer.USERNAME, attempt.username), (LockoutPer.ADDRESS, attempt.address)):
        rate = _rate(kind)
        if rate is not None and identity:
            logs.append(_Log(kind=str(kind), identity=identity, limit=rate[0], period=rate[1]))
    return logs


def _rate(kind: str) -> tuple[int, int] | None:
    """(wrong passwords, seconds) that lock a username (``user``) or an address (``ip``) out; None: never."""
    if kind == LockoutPer.USERNAME:
        return settings.TRAINYARD["LOGIN_LOCKOUT_USER"]
    return settings.TRAINYARD["LOGIN_LOCKOUT_IP"]


def _refusal(log: _Log, until: datetime, now: float) -> LockedOut:
    # Rounded to the millisecond first: a datetime keeps microseconds, the clock more.
    wait = max(1, math.ceil(round(until.timestamp() - now, 3)))
    return LockedOut(SCOPE, log.kind, log.limit, log.period, wait, until)


def _datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)


def _client() -> redis.Redis:
    return shared_client(settings.REDIS_URL, timeout=REDIS_TIMEOUT_SECONDS)

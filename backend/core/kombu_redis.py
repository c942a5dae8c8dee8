"""A closed broker channel fails as a connection error, not AttributeError.

kombu 5.7's Redis channel, when the broker goes away with a message
delivered but not acked (``CELERY_TASK_ACKS_LATE``: every running task),
closes its connection pools and then restores the unacked messages through
a pool it builds from its transport's client, which closing cleared: an
``AttributeError`` (``'NoneType' object has no attribute 'hostname'``).
Celery's consumer treats only connection errors as recoverable, so the
worker died ("Unrecoverable error"), no task ran again, and a runner that
finished its job was never retired (tests/e2e/test_outages.py, Redis killed
and started again). The same happens to an ack of a message of the old
connection after the reconnect.

``patch()`` makes that step raise the Redis client's ``ConnectionError``
instead: the restore and the late ack are then logged and skipped as the
connection errors they are, and the consumer reconnects. Nothing is lost:
the unacked messages stay in Redis' unacked index, which kombu restores to
the queue after the visibility timeout (a Redis that restarted empty has
none to restore). Decision 0063.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

_original = kombu_redis.Channel._connparams  # type: ignore[attr-defined]


def _connparams(self: Any, asynchronous: bool = False) -> Any:
    if getattr(self.connection, "client", None) is None:
        raise redis.exceptions.ConnectionError("the broker channel is closed (its connection went away)")
    return _original(self, asynchronous=asynchronous)


def patch() -> None:
    kombu_redis.Channel._connparams = _connparams  # type: ignore[attr-defined]

"""The worker survives the broker going away with tasks unacked
(backend/core/kombu_redis.py): a closed Redis channel's restore and late
acks fail as connection errors, which Celery's consumer logs and recovers
from, not as AttributeError, which killed the worker. Against the real
Redis; tests/e2e/test_outages.py kills the broker under a running stack."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from kombu import Connection
from kombu.common import ignore_errors

from backend.core import kombu_redis


def test_a_closed_channel_fails_its_restore_as_a_connection_error() -> None:
    kombu_redis.patch()
    connection = Connection(settings.CELERY_BROKER_URL)
    try:
        channel = connection.default_channel
        with channel.conn_or_acquire() as client:
            assert client.ping()
        # What closing the connection leaves (kombu.Connection._close clears
        # the transport's client; the channel's close drops its pools) before
        # the channel restores its unacked messages.
        channel._disconnect_pools()
        connection.transport.client = None

        with pytest.raises(redis.exceptions.ConnectionError):
            channel.qos.restore_unacked()
        assert isinstance(redis.exceptions.ConnectionError(), connection.connection_errors)
        # How Celery's consumer calls the restore when the broker went away: swallowed, not raised.
        connection.transport.client = connection
        errors = connection.connection_errors
        connection.transport.client = None
        with ignore_errors(_Errors(errors)):
            channel.qos.restore_unacked()
    finally:
        connection.transport.client = connection
        connection.release()


class _Errors:
    """The part of a kombu Connection ``ignore_errors`` reads."""

    def __init__(self, errors: tuple[type[BaseException], ...]) -> None:
        self.connection_errors = errors
        self.channel_errors = ()

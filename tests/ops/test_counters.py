"""The shared counters never hold up the work they count: a Redis that
stops answering costs one short timeout, then increments are skipped for a
while (backend/core/counters.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from django.test import override_settings

from backend.core import counters


@pytest.fixture
def silent_redis() -> Iterator[str]:
    """A server that accepts connections and never answers (a frozen Redis)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"


@pytest.fixture
def fresh_client() -> Iterator[None]:
    """The counters' back-off forgotten (the client is per REDIS_URL)."""
    counters._down_until = 0.0
    yield
    counters._down_until = 0.0


def test_a_frozen_redis_costs_one_short_timeout_then_nothing(silent_redis: str, fresh_client: None) -> None:
    with override_settings(REDIS_URL=silent_redis):
        started = time.monotonic()
        counters.log_ingested(lines=10, size=100)
        first = time.monotonic() - started
        started = time.monotonic()
        for _ in range(100):
            counters.log_ingested(lines=10, size=100)
        next_hundred = time.monotonic() - started

    assert first < counters.TIMEOUT_SECONDS + 0.5
    assert next_hundred < 0.05


def test_counts_add_up_across_calls(fresh_client: None) -> None:
    with override_settings(METRICS_PREFIX=f"test-{time.monotonic_ns()}:metrics"):
        counters.log_ingested(lines=3, size=30)
        counters.log_ingested(lines=4, size=41)
        counters.provisioning_observe(4.0)
        counters.provisioning_observe(45.0)

        assert (counters.counter("log_lines"), counters.counter("log_bytes")) == (7, 71)
        histogram = counters.provisioning_histogram()
        counters._client().delete(counters._key("log_lines"), counters._key("log_bytes"), counters._key("provisioning"))

    assert (histogram.count, histogram.total) == (2, 49.0)
    assert dict(histogram.buckets)[2.5] == 0
    assert dict(histogram.buckets)[5.0] == 1
    assert dict(histogram.buckets)[30.0] == 1
    assert dict(histogram.buckets)[60.0] == 2
    assert dict(histogram.buckets)[float("inf")] == 2

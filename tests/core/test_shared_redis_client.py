"""The process's Redis clients are made once, even when many threads ask at
once: a second client, dropped by a cache that kept the first, closed its
connection pool under the request still using it (a 500 in the 50-run burst,
"I/O operation on closed file"). With ``functools.cache`` in its place, a
round of 32 threads made more than one client now and then: one run in four
of 50 rounds passed with it. This test runs 200 rounds."""

from __future__ import annotations

import threading

from django.conf import settings

from backend.core import redis as shared


def _round(timeout: float) -> list[object]:
    start = threading.Barrier(32)
    got: list[object] = []

    def ask() -> None:
        start.wait()
        got.append(shared.shared_client(settings.REDIS_URL, timeout=timeout))

    threads = [threading.Thread(target=ask) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return got


def test_threads_that_ask_at_once_get_one_client_that_works() -> None:
    for n in range(200):
        timeout = 4.0 + n / 10000  # options of its own each round: a client nobody made yet
        got = _round(timeout)

        assert len(got) == 32
        assert len({id(c) for c in got}) == 1, f"round {n}: {len({id(c) for c in got})} clients"
        assert shared.shared_client(settings.REDIS_URL, timeout=timeout) is got[0]
    assert got[0].ping()  # type: ignore[attr-defined]
    assert shared.shared_client(settings.REDIS_URL, timeout=timeout, decode_responses=True) is not got[0]

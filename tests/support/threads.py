"""Work on a thread of its own, with its own database connection, for tests
that race real transactions against each other."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections


def in_thread(work: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``work`` in a thread on its own connection; the returned callable
    joins it and returns what ``work`` returned, or raises what it raised."""
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()

    def join() -> Any:
        thread.join(timeout=60)
        assert not thread.is_alive(), "the thread is stuck"
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    return join

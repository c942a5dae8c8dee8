"""Waiting in end-to-end tests for what a user would see happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    what: str, check: Callable[[], Any], timeout: float, explain: Callable[[], Any] | None = None, every: float = 0.5
) -> Any:
    """``check()`` once it is truthy, polled every ``every`` s; after
    ``timeout`` s an AssertionError naming ``what`` and, if given, what
    ``explain()`` says stood in the way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (f": {explain()}" if explain else ""))

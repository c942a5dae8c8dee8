"""What a transaction queued through ``backend.core.enqueue``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from backend.core import enqueue


def enqueued(callbacks: Iterable[Callable[..., Any]]) -> list[str]:
    """The task names among on-commit callbacks (``django_capture_on_commit_callbacks``)."""
    return [c.args[0] for c in callbacks if isinstance(c, partial) and c.func is enqueue.send]

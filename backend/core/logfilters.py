"""Logging filters for the noise of periodic work."""

from __future__ import annotations

import logging


class DropBeatTicks(logging.Filter):
    """Beat logs one line per due task; the reconciler is due every few seconds."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Scheduler: Sending due task")

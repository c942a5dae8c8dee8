"""One JSON object per log line (TRAINYARD_LOG_FORMAT=json): what a log
collector parses without a pattern. A multi-line message or traceback stays
inside its one line (JSON escapes the newlines)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime


class JsonFormatter(logging.Formatter):
    """Keys: ``time`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``,
    ``message``; ``exception`` with the traceback text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)

"""Security events: what an operator's alerting watches for (a runner's
token used from a second connection, a hello whose machine identity does
not hold). One logger, ``trainyard.security``, one warning line each:
``security event <kind>: <what>`` (docs/SECURITY.md)."""

from __future__ import annotations

import logging

logger = logging.getLogger("trainyard.security")


def security_event(kind: str, message: str) -> None:
    logger.warning("security event %s: %s", kind, message, extra={"security_event": kind})

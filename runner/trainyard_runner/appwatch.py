"""A Jupyter dev environment's activity, for the server's idle rule
(docs/decisions/0104-dev-environments.md).

While such a job runs (its environment has ``JUPYTER_TOKEN``: the server
gives one only to a lab or notebook job, which serves on ``PORT_0``), the
runner asks its Jupyter every ``PROBE_SECONDS`` when it last saw activity
(``/api/status``: requests, kernel messages, terminals) and whether a kernel
is busy now (``/api/kernels``), with the job's token, on 127.0.0.1 only. The
heartbeat carries how long ago that was (``Heartbeat.app_idle_seconds``).
The probes are not activity themselves: ``/api/status`` is not counted by
Jupyter, ``/api/kernels`` is asked with ``no_track_activity``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)

TOKEN_VARIABLE = "JUPYTER_TOKEN"
PROBE_SECONDS = 30.0
TIMEOUT_SECONDS = 5.0
MAX_BODY = 1 << 20


class AppWatch:
    """Asks one job's Jupyter on ``port`` with ``token``; ``active_at`` (unix
    time, this machine's clock) is the latest activity it reported."""

    def __init__(self, port: int, token: str, every: float = PROBE_SECONDS) -> None:
        self.port, self._token, self._every = port, token, every
        self.active_at: float | None = None

    def idle_seconds(self) -> float | None:
        return None if self.active_at is None else max(0.0, time.time() - self.active_at)

    async def run(self) -> None:
        """Probe until cancelled; a Jupyter not up yet or not answering is asked again next time."""
        while True:
            await asyncio.sleep(self._every)
            found = await asyncio.to_thread(self.probe)
            if found is not None:
                self.active_at = max(found, self.active_at or 0.0)

    def probe(self) -> float | None:
        """When Jupyter last saw activity (now, if a kernel is busy); None when it did not answer."""
        try:
            status = self._get("/api/status")
            kernels = self._get("/api/kernels?no_track_activity=1")
        except (OSError, ValueError) as e:
            log.debug("jupyter on port %d: %s", self.port, e)
            return None
        states = [k.get("execution_state") for k in kernels if isinstance(k, dict)] if isinstance(kernels, list) else []
        if "busy" in states:
            return time.time()
        last = status.get("last_activity") if isinstance(status, dict) else None
        return datetime.fromisoformat(last.replace("Z", "+00:00")).timestamp() if isinstance(last, str) else None

    def _get(self, path: str) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", headers={"Authorization": f"token {self._token}"}
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            return json.loads(response.read(MAX_BODY))

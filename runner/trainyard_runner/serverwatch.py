"""A runner cut off from the server stops its jobs before the server runs
them again elsewhere.

The server fences a runner it has not heard from for its unreachable grace
(counted from when the runner's heartbeats stopped) and retries its jobs on
another machine. A self-hosted machine is never terminated by the server,
so a runner on the far side of a partition would go on running a job the
server has already started again: two copies, both writing. So the runner
keeps the time it last heard the server (a welcome, any message, a pong)
and, once it has not for the grace the server sent in its ``Welcome``,
stops every job whose workflow did not say ``on_server_lost: keep-running``.
The runner last heard the server a round trip after the server last heard
it, and the server counts the grace only after a heartbeat timeout of
silence, so the runner stops first. A server that sends no grace (cloud and local machines, which the
server terminates or kills itself) stops nothing here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Protocol

from . import protocol as p

log = logging.getLogger(__name__)


class StoppableJob(Protocol):
    id: str
    spec: p.AssignJob

    @property
    def executing(self) -> bool: ...

    def cancel(self, reason: str) -> None: ...


class ServerWatch:
    def __init__(self) -> None:
        self.grace: float | None = None
        self._heard_at = time.monotonic()
        self._stopped: set[tuple[str, int]] = set()

    def heard(self) -> None:
        self._heard_at = time.monotonic()

    def welcomed(self, welcome: p.Welcome) -> None:
        self.grace = welcome.unreachable_grace_seconds
        self.heard()

    def lost_for(self) -> float:
        return time.monotonic() - self._heard_at

    def stop_cut_off(self, jobs: Iterable[StoppableJob]) -> list[str]:
        """Stop the jobs a server past its grace would run again; returns their ids."""
        lost = self.lost_for()
        if self.grace is None or lost <= self.grace:
            return []
        stopped = []
        for job in jobs:
            key = (job.id, job.spec.attempt)
            if job.spec.keep_running_server_lost or not job.executing or key in self._stopped:
                continue
            self._stopped.add(key)
            reason = (
                f"the runner lost the server for {lost:.0f}s (its unreachable grace is {self.grace:.0f}s): "
                "stopped, so that the server's retry elsewhere is the only copy "
                "(a workflow with on_server_lost: keep-running keeps running)"
            )
            log.warning("job %s: %s", job.id, reason)
            job.cancel(reason)
            stopped.append(job.id)
        return stopped

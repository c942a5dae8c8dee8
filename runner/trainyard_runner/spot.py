"""Watching for the cloud taking the machine back.

``--cloud kubernetes``: the notice is the pod's SIGTERM (the pod is being
deleted: preempted, evicted, its node drained or shut down, or deleted by the
server). The pod is killed when its grace period is over
(``TRAINYARD_RUNNER_TERMINATION_GRACE`` seconds, the pod's
``terminationGracePeriodSeconds``): ``pod_termination_notice`` makes the
notice for ``TERMINATION_MARGIN`` seconds before that, so the runner reports
and exits before the SIGKILL.

``--cloud aws``:

The runner polls instance metadata with IMDSv2 (``machine.Imds``):
``spot/instance-action`` every ``notice_every`` seconds (5; 404 until a
notice, then ``{"action": "terminate"|"stop", "time": "…Z"}``) and
``events/recommendations/rebalance`` every ``rebalance_every`` seconds (30;
404 until a recommendation, then ``{"noticeTime": "…Z"}``). Each notice and
each recommendation is handed on once. What the runner then does with the
job is ``Job.interrupt`` (docs/RUNNER.md, "Spot interruption").
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from .machine import Imds

log = logging.getLogger(__name__)

NOTICE_PATH = "spot/instance-action"
REBALANCE_PATH = "events/recommendations/rebalance"
NOTICE_EVERY = 5.0
REBALANCE_EVERY = 30.0
WARN_EVERY = 60.0  # a metadata service that does not answer is logged at most this often
DEFAULT_TERMINATION_GRACE = 30.0  # Kubernetes' default terminationGracePeriodSeconds
TERMINATION_MARGIN = 5.0  # the notice's time is this long before the pod's SIGKILL


@dataclass(frozen=True)
class Notice:
    """The cloud reclaims the machine at ``at`` (unix time); ``when`` as the
    cloud wrote it; ``reason``: how the job's interruption is explained
    (empty: a spot interruption notice)."""

    action: str
    at: float
    when: str
    reason: str = ""


def pod_termination_notice(grace: float, *, now: float | None = None) -> Notice:
    """The notice a pod's SIGTERM stands for: the machine goes ``grace``
    seconds from ``now``, the runner's deadline is ``TERMINATION_MARGIN``
    before that."""
    at = (time.time() if now is None else now) + max(grace - TERMINATION_MARGIN, 0.0)
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    reason = (
        f"the pod got SIGTERM (it is being deleted: a preemption, an eviction, its node drained or shut down,"
        f" or the server's own stop); its grace period of {grace:g}s leaves the job until {when}"
    )
    return Notice(action="terminate", at=at, when=when, reason=reason)


def parse_notice(body: str) -> Notice | None:
    """``{"action": "terminate", "time": "2026-12-01T12:00:00Z"}`` → Notice; None if it is not one."""
    try:
        raw = json.loads(body)
        when = str(raw["time"])
        at = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except (ValueError, KeyError, TypeError):
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return Notice(action=str(raw.get("action", "")), at=at.timestamp(), when=when)


class SpotWatcher:
    def __init__(
        self,
        imds: Imds,
        *,
        on_notice: Callable[[Notice], None],
        on_rebalance: Callable[[str], None],
        notice_every: float = NOTICE_EVERY,
        rebalance_every: float = REBALANCE_EVERY,
    ) -> None:
        self._imds = imds
        self._on_notice = on_notice
        self._on_rebalance = on_rebalance
        self._notice_every = max(notice_every, 0.1)
        self._rebalance_every = max(rebalance_every, 0.1)
        self._notice: Notice | None = None
        self._rebalance_seen = ""
        self._warned_at = 0.0

    async def run(self) -> None:
        """Poll until cancelled."""
        log.info(
            "watching %s for spot interruption notices (every %gs) and rebalance recommendations (every %gs)",
            self._imds.base,
            self._notice_every,
            self._rebalance_every,
        )
        next_rebalance = time.monotonic()
        while True:
            await self._poll_notice()
            if time.monotonic() >= next_rebalance:
                await self._poll_rebalance()
                next_rebalance = time.monotonic() + self._rebalance_every
            await asyncio.sleep(self._notice_every)

    async def _poll_notice(self) -> None:
        body = await self._get(NOTICE_PATH)
        if body is None:
            return
        notice = parse_notice(body)
        if notice is None:
            log.warning("ignoring a spot instance-action the runner does not understand: %.200s", body)
            return
        if notice == self._notice:
            return
        self._notice = notice
        log.warning(
            "spot interruption notice: the cloud will %s this machine at %s (in %.0fs)",
            notice.action or "reclaim",
            notice.when,
            notice.at - time.time(),
        )
        self._on_notice(notice)

    async def _poll_rebalance(self) -> None:
        body = await self._get(REBALANCE_PATH)
        if body is None or body == self._rebalance_seen:
            return
        self._rebalance_seen = body
        log.warning("rebalance recommendation: %.200s", body)
        self._on_rebalance(body)

    async def _get(self, path: str) -> str | None:
        try:
            return await asyncio.to_thread(self._imds.get, path)
        except (OSError, urllib.error.URLError, ValueError) as e:
            if time.monotonic() - self._warned_at >= WARN_EVERY:
                self._warned_at = time.monotonic()
                log.warning("could not read %s from the instance metadata at %s: %s", path, self._imds.base, e)
            return None


__all__ = ["Notice", "SpotWatcher", "parse_notice", "pod_termination_notice"]

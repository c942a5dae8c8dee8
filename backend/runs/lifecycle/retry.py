"""Whether an ended attempt is tried again, from its reason and the
workflow's ``retry:`` (docs/RUNS.md, "Retries").

Defaults when the key is absent: retry on ``interruption`` and
``instance_lost``, at most 5 attempts, within 1 hour of the first attempt's
start; never on ``error``. ``retry: true`` is the defaults; ``retry: false``
is one attempt. ``limit`` counts attempts, the first included;
``duration: off`` (stored as 0) sets no time limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from backend.runs.reasons import TerminationReason

DEFAULT_EVENTS = ("interruption", "instance_lost")
DEFAULT_LIMIT = 5
DEFAULT_DURATION_SECONDS = 3600
EVENTS = ("interruption", "instance_lost", "error", "no_capacity", "low_gpu_utilization", "stalled")


@dataclass(frozen=True)
class RetryPolicy:
    on_events: tuple[str, ...] = DEFAULT_EVENTS
    limit: int = DEFAULT_LIMIT
    duration_seconds: int = DEFAULT_DURATION_SECONDS

    @classmethod
    def from_spec(cls, spec: Mapping[str, object] | None) -> RetryPolicy:
        """From ``Job.retry_policy`` (``retry: false`` is stored as no events, limit 1)."""
        if not spec:
            return cls()
        events = spec.get("on_events")
        limit = spec.get("limit")
        duration = spec.get("duration")
        return cls(
            on_events=tuple(str(e) for e in events) if isinstance(events, list) else DEFAULT_EVENTS,
            limit=int(limit) if isinstance(limit, int) else DEFAULT_LIMIT,
            duration_seconds=int(duration) if isinstance(duration, int) else DEFAULT_DURATION_SECONDS,
        )


@dataclass(frozen=True)
class Decision:
    retry: bool
    why: str  # for the job's reason: "retrying (attempt 2 of 5)" or why not


def retry_decide(
    *,
    policy: RetryPolicy,
    reason: TerminationReason,
    attempts: int,
    first_started_at: datetime | None,
    now: datetime,
    max_wait: int | None = None,
    waited: float = 0.0,
    restart: bool = False,
) -> Decision:
    """``attempts``: how many attempts counted so far (this one included).
    ``max_wait`` (seconds; 0: off) and ``waited``: a job whose workflow sets
    ``max_wait`` waits for capacity that long, whatever ``retry:`` says
    about ``no_capacity`` (docs/RUNS.md, "Placement"). ``restart``: the
    attempt was ended by ``stall: {action: restart}``: the job gets another
    attempt whatever ``on_events`` says and however long it has run, as long
    as ``limit`` allows (each restart is an attempt; docs/WORKFLOWS.md, "Guards")."""
    if not reason.counts_as_retry:
        return Decision(True, "trying again")
    if restart:
        if attempts >= policy.limit:
            return Decision(False, f"not restarted: {attempts} of {policy.limit} attempts used (retry: limit)")
        return Decision(True, f"restarting from its last checkpoint (attempt {attempts + 1} of {policy.limit})")
    if reason == TerminationReason.NO_CAPACITY and max_wait is not None:
        return _capacity_wait(max_wait, waited)
    event = reason.retry_event
    if event is None or event not in policy.on_events:
        return Decision(False, "")
    if attempts >= policy.limit:
        return Decision(False, f"not retried: {attempts} of {policy.limit} attempts used (retry: limit)")
    window = policy.duration_seconds  # 0: `duration: off`, no time limit
    if window and first_started_at and now - first_started_at > timedelta(seconds=window):
        return Decision(
            False, f"not retried: more than {policy.duration_seconds}s since the first attempt (retry: duration)"
        )
    return Decision(True, f"retrying (attempt {attempts + 1} of {policy.limit})")


def _capacity_wait(max_wait: int, waited: float) -> Decision:
    if max_wait == 0:
        return Decision(True, "waiting for capacity (max_wait: off)")
    if waited < max_wait:
        return Decision(True, f"waiting for capacity ({max_wait - waited:.0f}s of max_wait {max_wait}s left)")
    return Decision(False, f"not retried: waited {waited:.0f}s for capacity (max_wait {max_wait}s)")

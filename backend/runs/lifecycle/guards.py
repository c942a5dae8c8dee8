"""A job's guards (docs/WORKFLOWS.md, "Guards"): ``utilization_policy``
(its GPUs all stayed below a threshold for a window) and ``stall`` (no new
log line and no new training value for a timeout), as stored on
``Job.placement`` at submission.

What is stored is the workflow's own key, or, where the workflow has none,
the workspace's default (``Workspace.guard_defaults``); ``off`` in the
workflow turns the default off. A key on the placement is a guard that
applies, its durations in seconds. ``services.guards`` watches the jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models.functions import Now

from backend.accounts.guards import GUARD_KEYS, duration_words
from backend.runs.models import Attempt, Job
from backend.runs.reasons import TerminationReason


@dataclass(frozen=True)
class UtilizationGuard:
    min_gpu_utilization: int  # percent
    window: int  # seconds


@dataclass(frozen=True)
class StallGuard:
    timeout: int  # seconds
    action: str  # "stop" or "restart"


@dataclass(frozen=True)
class Guards:
    utilization: UtilizationGuard | None = None
    stall: StallGuard | None = None

    @classmethod
    def of(cls, job: Job) -> Guards:
        return cls.from_placement(job.placement)

    @classmethod
    def from_placement(cls, placement: Mapping[str, Any] | None) -> Guards:
        placement = placement or {}
        util, stall = placement.get("utilization_policy"), placement.get("stall")
        utilization = None
        if isinstance(util, Mapping) and _seconds(util.get("time_window")):
            utilization = UtilizationGuard(int(util.get("min_gpu_utilization") or 0), _seconds(util["time_window"]))
        stalled = None
        if isinstance(stall, Mapping) and _seconds(stall.get("timeout")):
            action = "restart" if stall.get("action") == "restart" else "stop"
            stalled = StallGuard(_seconds(stall["timeout"]), action)
        return cls(utilization=utilization, stall=stalled)

    def words(self) -> list[str]:
        """``utilization_policy: stopped when every GPU stays below 10% for 30m`` and the stall's."""
        out = []
        if self.utilization is not None:
            out.append(
                f"utilization_policy: stopped when every GPU stays below {self.utilization.min_gpu_utilization}% "
                f"for {duration_words(self.utilization.window)}"
            )
        if self.stall is not None:
            what = "stopped" if self.stall.action == "stop" else "restarted from its last checkpoint"
            out.append(f"stall: {what} after {duration_words(self.stall.timeout)} without output")
        return out


def guards_resolved(workflow: Mapping[str, object], defaults: Mapping[str, object]) -> dict[str, object]:
    """What goes on a job's placement: each guard of the workflow
    (``Workflow.guards()``), else the workspace's default; ``off`` leaves it out."""
    out: dict[str, object] = {}
    for key in GUARD_KEYS:
        value = workflow.get(key, defaults.get(key))
        if isinstance(value, Mapping):
            out[key] = dict(value)
    return out


def attempt_commands_started(*, job_id: str, instance_id: str, attempt: int) -> None:
    """The runner says the attempt's commands started: ``stall``'s clock
    starts (``Attempt.last_output_at``, then moved by every stored batch of
    lines). Preparing (the code, the inputs, the environment) is not watched."""
    Attempt.objects.current(job_id=job_id, number=attempt, instance_id=instance_id).filter(last_output_at=None).update(
        last_output_at=Now()
    )


def guard_restarts(job: Job, reason: TerminationReason) -> bool:
    """The attempt was ended by ``stall: {action: restart}``: the job gets a
    new attempt (``retry_decide``'s ``restart``)."""
    guard = Guards.of(job).stall
    return reason == TerminationReason.STALLED and guard is not None and guard.action == "restart"


def _seconds(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

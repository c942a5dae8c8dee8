"""Where and how a job may run: its workflow's placement keys (``backends``,
``regions``, ``spot_policy``, ``max_price``, ``max_wait``, ``idle_duration``,
``max_duration``, stored on ``Job.placement``), and the resources it asks
for, as the backends read them (``requirements_of``). The scheduler decides
with them which machines and offers a job may take (``scheduler.offers``);
the state machine reads them for retries and idle time. docs/RUNS.md,
"Placement", says it for users.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from backend.clouds.backends.base import Requirements, SpotPolicy
from backend.clouds.models import IDLE_FOREVER
from backend.runs.models import Attempt, Job
from backend.runs.reasons import TerminationReason

# spot_policy auto without max_wait: spot offers for this long, then on-demand.
AUTO_SPOT_WAIT_SECONDS = 600


@dataclass(frozen=True)
class Placement:
    backends: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    spot_policy: SpotPolicy = "on-demand"
    max_price: float | None = None
    max_wait: int | None = None  # seconds; None: absent; 0: off
    idle_duration: int | None = None  # seconds; None: the backend's; IDLE_FOREVER: off
    max_duration: int | None = None  # seconds; None: no limit

    @classmethod
    def of(cls, job: Job) -> Placement:
        return cls.from_spec(job.placement)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> Placement:
        spec = spec or {}
        policy = spec.get("spot_policy")
        return cls(
            backends=tuple(str(b) for b in spec.get("backends") or ()),
            regions=tuple(str(r) for r in spec.get("regions") or ()),
            spot_policy=policy if policy in ("spot", "on-demand", "auto") else "on-demand",
            max_price=float(spec["max_price"]) if spec.get("max_price") is not None else None,
            max_wait=_seconds(spec.get("max_wait"), off=0),
            idle_duration=_seconds(spec.get("idle_duration"), off=IDLE_FOREVER),
            max_duration=_seconds(spec.get("max_duration"), off=None),
        )

    def spot_wait(self) -> int | None:
        """auto: how long spot is tried before on-demand; None: no time limit."""
        if self.max_wait is None:
            return AUTO_SPOT_WAIT_SECONDS
        return self.max_wait or None

    def words(self) -> str:
        """``regions us-east-1, spot, at most $1.50/h`` (what filters the offers)."""
        parts = [f"backends {', '.join(self.backends)}"] if self.backends else []
        parts += [f"regions {', '.join(self.regions)}"] if self.regions else []
        parts += [self.spot_policy] if self.spot_policy != "on-demand" else ["on-demand"]
        parts += [f"at most ${self.max_price:.2f}/h"] if self.max_price is not None else []
        return ", ".join(parts)


def requirements_of(job: Job) -> Requirements:
    return requirements_from(resources=job.spec.get("resources") or {}, placement=job.placement)


def requirements_from(*, resources: Mapping[str, Any], placement: Mapping[str, Any] | None) -> Requirements:
    """From a job spec's resources (``ResourceSpec`` as a dict) and its placement."""
    where = Placement.from_spec(placement)
    return Requirements(
        cpu=resources.get("cpu"),
        memory_bytes=resources.get("memory_bytes"),
        disk_bytes=resources.get("disk_bytes"),
        shm_size_bytes=resources.get("shm_size_bytes"),
        gpu_count=resources.get("gpu_count") or 0,
        gpu_name=resources.get("gpu_name") or "",
        gpu_memory_bytes=resources.get("gpu_memory_bytes"),
        spot_policy=where.spot_policy,
        regions=where.regions,
        max_price=where.max_price,
    )


def waiting_since(job: Job) -> datetime:
    """When the job last started waiting for a machine: its submission, or
    the end of its last attempt that had one (a no_capacity attempt had none)."""
    last = (
        Attempt.objects.filter(job_id=job.pk)
        .exclude(termination_reason=TerminationReason.NO_CAPACITY)
        .exclude(finished_at=None)
        .order_by("-number")
        .first()
    )
    return last.finished_at if last is not None and last.finished_at else job.created_at


def _seconds(value: object, *, off: int | None) -> int | None:
    if value == "off":
        return off
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

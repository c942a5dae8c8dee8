"""The contract every cloud backend implements (docs/BACKENDS.md).

A backend turns a job's requirements into machines that run
``trainyard-runner``. Methods are called from Celery tasks, never inside a
database transaction, and must time out on every outbound call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from backend.clouds.models import Instance


@dataclass(frozen=True)
class Requirements:
    cpu: int | None
    memory_bytes: int | None
    gpu_count: int
    gpu_name: str


@dataclass(frozen=True)
class Capacity:
    cpus: int
    memory_bytes: int
    gpus: list[dict[str, object]]


class BackendError(Exception):
    """Provisioning failed. ``retryable`` means: try again or the next offer."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class Backend(ABC):
    kind: str

    @abstractmethod
    def unsatisfiable_reason(self, req: Requirements) -> str | None:
        """None when this backend could ever provide ``req``; otherwise why
        not, in words a user can act on ("this host has no GPUs")."""

    @abstractmethod
    def provision(self, *, instance: Instance, runner_token: str) -> str:
        """Start a machine whose runner connects with ``runner_token``; return
        its backend id. Not idempotent: call once per Instance row."""

    @abstractmethod
    def terminate(self, *, instance: Instance) -> None:
        """Stop the machine. Idempotent: terminating a gone machine is fine."""


def fits(req: Requirements, cap: Capacity) -> str | None:
    """None when ``cap`` covers ``req``; else the first shortfall, in words."""
    if req.cpu and req.cpu > cap.cpus:
        return f"{req.cpu} CPUs requested, {cap.cpus} available"
    if req.memory_bytes and req.memory_bytes > cap.memory_bytes:
        return f"{_gib(req.memory_bytes)} memory requested, {_gib(cap.memory_bytes)} available"
    if req.gpu_count:
        matching = [g for g in cap.gpus if not req.gpu_name or req.gpu_name.lower() in str(g.get("name", "")).lower()]
        if len(matching) < req.gpu_count:
            what = f"{req.gpu_count}× {req.gpu_name or 'GPU'}"
            have = ", ".join(str(g.get("name")) for g in cap.gpus) or "no GPUs"
            return f"{what} requested, this machine has {have}"
    return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"

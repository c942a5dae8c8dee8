"""The fake cloud's state, in files, so a test process and a Celery worker see
the same machines.

Under the ``state_dir``:

    machines/<key>.json  one machine per idempotency key (``Machine``)
    calls.jsonl          every launch and terminate call, one JSON object a
                         line: time, call, key, offer id, result
    counters.json        launches so far (for ``no_capacity_first``)
    runners/             real runner processes when ``run_runner`` is on
                         (``local/process.py``'s layout)
    .lock                flock'd around every call that reads or writes the above

``read_machines`` and ``read_calls`` are for tests' assertions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.clouds.backends.base import CloudState
from backend.clouds.backends.files import checked_key, locked, write_atomic


@dataclass(frozen=True)
class Machine:
    key: str
    backend_id: str
    instance_name: str
    installation: str
    account_id: str
    workspace_id: str
    offer_id: str
    instance_type: str
    region: str
    zone: str
    spot: bool
    price_per_hour: float
    launched_at: float
    runner: bool = False  # a real runner process was started for it
    tags: Mapping[str, str] = field(default_factory=dict)
    terminate_requested_at: float | None = None
    terminated_at: float | None = None
    interrupted_at: float | None = None
    vanished_at: float | None = None

    def state(self, *, now: float, boot_seconds: float) -> CloudState:
        if self.vanished_at is not None:
            return CloudState.NOT_FOUND
        if self.terminated_at is not None:
            return CloudState.TERMINATED
        if self.interrupted_at is not None:
            return CloudState.INTERRUPTED
        if self.terminate_requested_at is not None:
            return CloudState.STOPPING
        return CloudState.PENDING if now - self.launched_at < boot_seconds else CloudState.RUNNING

    def named(self, names: frozenset[str] | Mapping[str, object]) -> bool:
        return self.key in names or self.instance_name in names


class FakeState:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.machines_dir = path / "machines"

    def locked(self) -> contextlib.AbstractContextManager[None]:
        self.machines_dir.mkdir(parents=True, exist_ok=True)
        return locked(self.path)

    def machine(self, key: str) -> Machine | None:
        try:
            return _machine(json.loads((self.machines_dir / f"{checked_key(key)}.json").read_text()))
        except FileNotFoundError:
            return None

    def machines(self) -> list[Machine]:
        return [_machine(json.loads(p.read_text())) for p in sorted(self.machines_dir.glob("*.json"))]

    def save(self, machine: Machine) -> None:
        write_atomic(self.machines_dir / f"{machine.key}.json", json.dumps(dataclasses.asdict(machine)))

    def delete(self, key: str) -> None:
        (self.machines_dir / f"{key}.json").unlink(missing_ok=True)

    def log_call(self, call: str, key: str, result: str, **details: object) -> None:
        entry = {"time": time.time(), "call": call, "key": key, "result": result, **details}
        with open(self.path / "calls.jsonl", "a") as log:
            log.write(json.dumps(entry) + "\n")

    def bump(self, counter: str) -> int:
        """Add one to ``counter`` and return the new value."""
        path = self.path / "counters.json"
        counters = json.loads(path.read_text()) if path.exists() else {}
        counters[counter] = int(counters.get(counter, 0)) + 1
        write_atomic(path, json.dumps(counters))
        return int(counters[counter])


def read_machines(state_dir: Path) -> list[Machine]:
    """Every machine file of ``state_dir``, live or not (for tests)."""
    state = FakeState(state_dir)
    with state.locked():
        return state.machines()


def read_calls(state_dir: Path) -> list[dict[str, Any]]:
    """Every launch and terminate call so far, oldest first (for tests)."""
    path = state_dir / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _machine(raw: dict[str, Any]) -> Machine:
    return Machine(**raw)

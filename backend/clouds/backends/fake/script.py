"""The fake backend's script: a JSON file re-read on every call, so a test can
change how the "cloud" behaves while the system runs.

Keys, all optional::

    {
      "no_capacity": ["fake-small", "fake/fake-region-1/fake-region-1a/fake-large/spot"],
      "no_capacity_first": 2,
      "launch_error": {"kind": "quota", "code": "VcpuLimitExceeded", "message": "…",
                       "scope": "quota", "retry_after": 600, "only": ["fake-gpu", "r1a"]},
      "terminate_delay": 5,
      "interrupt": {"ty-…-1": 1767225600, "*": 1767225600},
      "vanish": ["ty-…-1", "fake-3f2a9c1e"],
      "launch_delay": 10,
      "describe_delay": 30
    }

``no_capacity``: offer ids or instance types whose launch raises NoCapacity.
``no_capacity_first``: the first N launches in the state dir raise NoCapacity.
``launch_error``: every launch raises this (kind ``no_capacity``, ``quota``,
``auth``, ``invalid`` or ``transient``; optional ``scope`` and ``retry_after``
as ``errors.py`` has them; ``only``: just for these offer ids, instance types,
zones or quota families). ``terminate_delay``: terminate raises
NotYetTerminated for this many seconds after its first call. ``interrupt``:
from that unix time on, the machine (by key or instance name; ``"*"``: every
machine launched by then) is INTERRUPTED and its runner SIGKILLed.
``vanish``: machines (by key or instance name) the cloud no longer knows:
NOT_FOUND, runner SIGKILLed. ``launch_delay``: a new machine's launch
returns this many seconds after the machine (and its runner) started, as a
slow cloud API would: a window in which to kill the caller.
``describe_delay``: every ``describe`` and ``list_managed`` takes this many
seconds, as a slow or hanging cloud API would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from backend.clouds.backends.errors import (
    AuthFailed,
    ComputeError,
    InvalidConfig,
    NoCapacity,
    QuotaExceeded,
    Scope,
    Transient,
)
from backend.clouds.backends.files import write_atomic

LAUNCH_ERRORS: Mapping[str, type[ComputeError]] = {
    "no_capacity": NoCapacity,
    "quota": QuotaExceeded,
    "auth": AuthFailed,
    "invalid": InvalidConfig,
    "transient": Transient,
}
KEYS = frozenset(
    {
        "no_capacity",
        "no_capacity_first",
        "launch_error",
        "terminate_delay",
        "interrupt",
        "vanish",
        "launch_delay",
        "describe_delay",
    }
)


@dataclass(frozen=True)
class Script:
    no_capacity: frozenset[str] = frozenset()
    no_capacity_first: int = 0
    launch_error: ComputeError | None = None
    launch_error_only: frozenset[str] = frozenset()  # empty: every launch
    terminate_delay: float = 0.0
    interrupt: Mapping[str, float] = field(default_factory=dict)
    vanish: frozenset[str] = frozenset()
    launch_delay: float = 0.0
    describe_delay: float = 0.0


def load_script(path: Path | None) -> Script:
    """The script in ``path``; an empty one when there is no path or no file.
    ``InvalidConfig`` naming the file when it is not a valid script."""
    if path is None:
        return Script()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return Script()
    except (OSError, ValueError) as exc:
        raise _bad(path, f"is not readable JSON ({exc})") from exc
    if not isinstance(raw, dict) or not KEYS.issuperset(raw):
        raise _bad(path, f"must be an object with keys among {sorted(KEYS)}")
    try:
        return _parse(raw)
    except (TypeError, ValueError, KeyError) as exc:
        raise _bad(path, f"is invalid: {exc}") from exc


def write_script(path: Path, script: Mapping[str, object]) -> None:
    """Replace the script atomically, so a reader never sees half a file."""
    write_atomic(path, json.dumps(script))


def _parse(raw: Mapping[str, object]) -> Script:
    interrupt = raw.get("interrupt", {})
    if not isinstance(interrupt, dict):
        raise TypeError("interrupt must map keys or instance names to unix times")
    return Script(
        no_capacity=_names(raw.get("no_capacity", []), "no_capacity"),
        no_capacity_first=int(_number(raw.get("no_capacity_first", 0), "no_capacity_first")),
        launch_error=_launch_error(raw.get("launch_error")),
        launch_error_only=_names(_dict(raw.get("launch_error")).get("only", []), "launch_error.only"),
        terminate_delay=_number(raw.get("terminate_delay", 0), "terminate_delay"),
        interrupt={str(name): _number(at, f"interrupt[{name!r}]") for name, at in interrupt.items()},
        vanish=_names(raw.get("vanish", []), "vanish"),
        launch_delay=_number(raw.get("launch_delay", 0), "launch_delay"),
        describe_delay=_number(raw.get("describe_delay", 0), "describe_delay"),
    )


def _launch_error(raw: object) -> ComputeError | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("kind") not in LAUNCH_ERRORS:
        raise ValueError(f"launch_error must be {{kind, code, message}} with kind one of {sorted(LAUNCH_ERRORS)}")
    error = LAUNCH_ERRORS[raw["kind"]]
    scope = Scope(raw["scope"]) if "scope" in raw else None
    retry_after = _number(raw["retry_after"], "launch_error.retry_after") if "retry_after" in raw else None
    message = str(raw.get("message", "scripted launch error"))
    return error(message, code=str(raw.get("code", "")), scope=scope, retry_after=retry_after)


def _dict(raw: object) -> dict[str, object]:
    return raw if isinstance(raw, dict) else {}


def _names(raw: object, key: str) -> frozenset[str]:
    if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
        raise TypeError(f"{key} must be a list of strings")
    return frozenset(raw)


def _number(raw: object, key: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw < 0:
        raise TypeError(f"{key} must be a number ≥ 0")
    return float(raw)


def _bad(path: Path, what: str) -> InvalidConfig:
    return InvalidConfig(f"the fake backend's script {path} {what}", code="BadScript")

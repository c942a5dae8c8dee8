"""A workspace's default guards (``Workspace.guard_defaults``): written as
a workflow writes ``utilization_policy`` and ``stall`` (docs/WORKFLOWS.md,
"Guards"), read with the workflow keys' own models, so a default means
exactly what the same key in a workflow means. The Django admin, the API
(``GET``/``PUT .../guards/``) and submission all read them here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from trainyard_spec._messages import message
from trainyard_spec.schema import StallPolicy, UtilizationPolicy

GUARD_KEYS = ("utilization_policy", "stall")
_MODELS: dict[str, type[BaseModel]] = {"utilization_policy": UtilizationPolicy, "stall": StallPolicy}
_OFF = (None, "off", False)


def guard_defaults_parse(value: object) -> tuple[dict[str, object], list[str]]:
    """A workspace's ``guard_defaults`` as written (``{"stall": {"timeout":
    "20m", "action": "restart"}}``, the workflow keys' form) → as stored on
    placements (seconds), and the problems, each naming its key and what a
    good value looks like. A key that is null, ``off`` or false is no default."""
    if value in (None, ""):
        return {}, []
    if not isinstance(value, Mapping):
        return {}, ['expected a mapping such as {"stall": {"timeout": "20m"}}']
    out: dict[str, object] = {}
    problems = [f"unknown key '{key}'; allowed keys: {', '.join(GUARD_KEYS)}" for key in value if key not in _MODELS]
    for key, model in _MODELS.items():
        if key not in value or value[key] in _OFF:
            continue
        try:
            parsed: Any = model.model_validate(value[key])
        except ValidationError as e:
            problems += [f"{'.'.join([key, *map(str, err['loc'])])}: {message(err, model)}" for err in e.errors()]
            continue
        out[key] = parsed.stored()
    return out, problems


def guard_defaults_problems(value: object) -> list[str]:
    """What is wrong with a workspace's ``guard_defaults`` ([]: nothing)."""
    return guard_defaults_parse(value)[1]


def guard_defaults_written(value: object) -> dict[str, dict[str, object] | None]:
    """Every guard key → its default as a person writes it (durations as
    ``20m``, the action spelled out), or None where there is none. What the
    API shows and what it stores: reading it back gives the same guards."""
    stored = guard_defaults_parse(value)[0]
    util, stall = stored.get("utilization_policy"), stored.get("stall")
    written: dict[str, dict[str, object] | None] = dict.fromkeys(GUARD_KEYS)
    if isinstance(util, Mapping):
        written["utilization_policy"] = {
            "min_gpu_utilization": util["min_gpu_utilization"],
            "time_window": duration_words(int(util["time_window"])),
        }
    if isinstance(stall, Mapping):
        written["stall"] = {"timeout": duration_words(int(stall["timeout"])), "action": stall["action"]}
    return written


def duration_words(seconds: int) -> str:
    """``30m``, ``1h30m``, ``45s``: a duration as a workflow writes it."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"

"""Sizes (``16GB``) and durations (``1h30m``) as written in workflow files.

Sizes: a number and a unit, all units binary as cloud providers list memory
and as dstack reads them: ``B``, ``KB``/``KiB``/``K`` = 1024, ``MB``/``MiB``/``M``
= 1024², ``GB``/``GiB``/``G`` = 1024³, ``TB``/``TiB``/``T`` = 1024⁴; any case;
decimals allowed (``1.5GB``). A bare number is refused: ``memory: 16`` could
mean bytes or gigabytes, and guessing wrong costs money.

Durations: whole seconds as a number, or parts like ``90s``, ``30m``, ``2h``,
``1d``, ``1w``, ``1h30m``; ``off`` means no limit.

GPUs: ``NAME`` or ``NAME:COUNT`` (``A100``, ``A100:2``), the same words in a
workflow's ``gpu:`` and in ``trainyard offers --gpu``; the count is at least 1.
"""

from __future__ import annotations

import re

from pydantic_core import PydanticCustomError

SIZE_HINT = "expected a size such as 512MB or 16GB"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
_DURATION_PART = re.compile(r"(\d+)\s*([smhdw])", re.IGNORECASE)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(value: object) -> int:
    """Bytes for a size string; raises ``PydanticCustomError('size', …)``."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise PydanticCustomError("size", SIZE_HINT)
    if not isinstance(value, str):
        raise PydanticCustomError(
            "size",
            SIZE_HINT + " (a size needs a unit: write {example}, not {value})",
            {"example": f"{value}GB", "value": value},
        )
    match = _SIZE.match(value)
    if not match or (not match.group(2) and match.group(3).lower() != "b"):
        raise PydanticCustomError("size", SIZE_HINT + ", got '{value}'", {"value": value})
    number, prefix = float(match.group(1)), match.group(2).lower()
    size = int(number * 1024 ** _POWERS[prefix])
    if size <= 0:
        raise PydanticCustomError("size", "a size must be more than zero, got '{value}'", {"value": value})
    return size


GPU_HINT = "write a name and an optional count, e.g. A10G or A10G:2"


def parse_gpu(value: str) -> tuple[str, int]:
    """``(name, count)`` for ``NAME`` (count 1) or ``NAME:COUNT``; raises
    ``PydanticCustomError('gpu', …)``."""
    name, colon, count = value.partition(":")
    name, count = name.strip(), count.strip() if colon else "1"
    if not name or not count.isdigit():
        raise PydanticCustomError("gpu", GPU_HINT + ", got '{value}'", {"value": value})
    if int(count) < 1:
        raise PydanticCustomError(
            "gpu_count",
            "a gpu count must be at least 1, got {value} (to run without a GPU, leave out gpu)",
            {"value": int(count)},
        )
    return name, int(count)


def parse_duration(value: object) -> int | str:
    """Seconds for a duration, or ``"off"``; raises ``PydanticCustomError``."""
    hint = "expected a duration such as 30m, 2h or 1d (or off)"
    if value is False:
        return "off"  # YAML 1.1 reads a bare `off` as false
    if value is True:
        raise PydanticCustomError("duration", hint)
    if isinstance(value, int) and value >= 0:
        return value
    if not isinstance(value, str):
        raise PydanticCustomError("duration", hint)
    text = value.strip().lower()
    if text == "off":
        return "off"
    if not text or _DURATION_PART.sub("", text).strip():
        raise PydanticCustomError("duration", hint + ", got '{value}'", {"value": value})
    return sum(int(n) * _SECONDS[unit] for n, unit in _DURATION_PART.findall(text))

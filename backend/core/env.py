"""Typed readers for settings from the environment: bad values fail loudly."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

# The exit status of a command stopped by a ConfigError (sysexits.h EX_CONFIG):
# manage.py exits with it, and ``make run``'s supervisor tells it apart.
EXIT_CONFIG_ERROR = 78


class ConfigError(RuntimeError):
    """A setting from the environment is missing, malformed or unsafe.

    Its message is meant for the person starting the server: manage.py prints
    it alone (no traceback) and exits with ``EXIT_CONFIG_ERROR``."""


def env_str(name: str, default: str = "") -> str:
    """``NAME`` or the contents of the file named by ``NAME_FILE`` (for secrets)."""
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{name}_FILE={file_path!r} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use true or false)")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_json(name: str, default: Any) -> Any:
    """A JSON value (a list or an object of shapes, say)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} is not valid JSON: {exc}") from None


def env_url(name: str, default: str) -> str:
    """An http(s) URL without a trailing slash."""
    raw = os.environ.get(name) or default
    if not raw.startswith(("http://", "https://")) or raw[-3:] == "://":
        raise ConfigError(f"{name}={raw!r} is not an http(s) URL")
    return raw.rstrip("/")


_RATE = re.compile(r"^(\d+)\s*/\s*(\d*)\s*(s|sec|second|m|min|minute|h|hour|d|day)s?$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def env_rate(name: str, default: str) -> tuple[int, int] | None:
    """A rate limit ``N/period`` as (N, seconds): ``10/min``, ``100/hour``,
    ``5/30s``; ``off`` (or ``0``) is no limit (None)."""
    raw = (os.environ.get(name) or default).strip().lower()
    if raw in {"off", "0", "none"}:
        return None
    match = _RATE.match(raw)
    if match is None or int(match[1]) < 1 or match[2] == "0":
        raise ConfigError(f"{name}={raw!r} is not a rate: use N/period (10/min, 100/hour, 5/30s) or off")
    return int(match[1]), int(match[2] or 1) * _UNIT_SECONDS[match[3][0]]


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (the embedded supervisor writes one); missing file → {}."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values

"""Typed readers for ``AccountConfig.config``.

A backend gets its configuration only through ``AccountConfig.config`` (the
``clouds`` services fill it from Django settings and the account row). Every
reader raises ``InvalidConfig`` naming the key and the backend kind, so a bad
value stops the account with a message that says what to fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from backend.clouds.backends.base import AccountConfig, Gpu
from backend.clouds.backends.errors import InvalidConfig

_MISSING = object()


def config_str(account: AccountConfig, key: str, default: str | None = None) -> str:
    """A string; required when ``default`` is None."""
    value = _get(account, key, default)
    if not isinstance(value, str) or not value:
        raise _invalid(account, key, "a non-empty string", value)
    return value


def config_float(account: AccountConfig, key: str, default: float) -> float:
    value = _get(account, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _invalid(account, key, "a number ≥ 0", value)
    return float(value)


def config_bool(account: AccountConfig, key: str, default: bool) -> bool:
    value = _get(account, key, default)
    if not isinstance(value, bool):
        raise _invalid(account, key, "true or false", value)
    return value


def config_strings(account: AccountConfig, key: str, default: Sequence[str]) -> tuple[str, ...]:
    """A list of strings (a tuple or list in Python, an array in JSON)."""
    value = _get(account, key, list(default))
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise _invalid(account, key, "a list of strings", value)
    return tuple(value)


def config_dicts(account: AccountConfig, key: str) -> list[Mapping[str, object]] | None:
    """A list of objects, or None when the key is absent."""
    if account.config.get(key) is None:
        return None
    value = account.config[key]
    if not isinstance(value, list | tuple) or not all(isinstance(item, Mapping) for item in value):
        raise _invalid(account, key, "a list of objects", value)
    return list(value)


def field_int(
    account: AccountConfig, key: str, item: Mapping[str, object], name: str, default: int | None = None
) -> int:
    """An integer ≥ 0 field of one object in a list (``shapes[].cpus``)."""
    value = item.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _invalid(account, f"{key}[].{name}", "an integer ≥ 0", value)
    return value


def field_str(
    account: AccountConfig, key: str, item: Mapping[str, object], name: str, default: str | None = None
) -> str:
    value = item.get(name, default)
    if not isinstance(value, str) or (default is None and not value):
        raise _invalid(account, f"{key}[].{name}", "a non-empty string", value)
    return value


def field_float(account: AccountConfig, key: str, item: Mapping[str, object], name: str, default: float) -> float:
    value = item.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _invalid(account, f"{key}[].{name}", "a number ≥ 0", value)
    return float(value)


def field_bool(account: AccountConfig, key: str, item: Mapping[str, object], name: str, default: bool) -> bool:
    value = item.get(name, default)
    if not isinstance(value, bool):
        raise _invalid(account, f"{key}[].{name}", "true or false", value)
    return value


def field_gpus(account: AccountConfig, key: str, item: Mapping[str, object]) -> tuple[Gpu, ...]:
    """``gpus: [{name, memory_bytes}]`` of one object in a list."""
    raw = item.get("gpus", [])
    if not isinstance(raw, list | tuple) or not all(isinstance(gpu, Mapping) for gpu in raw):
        raise _invalid(account, f"{key}[].gpus", "a list of {name, memory_bytes} objects", raw)
    where = f"{key}[].gpus"
    return tuple(
        Gpu(name=field_str(account, where, gpu, "name"), memory_bytes=field_int(account, where, gpu, "memory_bytes", 0))
        for gpu in raw
    )


def _get(account: AccountConfig, key: str, default: object) -> object:
    value = account.config.get(key, _MISSING)
    if value is _MISSING:
        if default is None:
            raise InvalidConfig(f"the {account.kind} backend needs config key {key!r}", code="MissingConfig")
        return default
    return value


def _invalid(account: AccountConfig, key: str, expected: str, value: object) -> InvalidConfig:
    return InvalidConfig(
        f"the {account.kind} backend's config key {key!r} must be {expected}, not {value!r}", code="BadConfig"
    )

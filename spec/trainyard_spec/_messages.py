"""Workflow-file error messages a person can act on: the key path of a
location (``workflows[2] (finetune-model).resources.memory``) and pydantic
errors turned into plain sentences ("unknown key 'comands'; did you mean
'commands'?")."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails


def key_path(loc: tuple[str | int, ...], data: Any, *, prefix: str = "") -> str:
    """``workflows[2] (finetune-model).resources.memory`` for a loc."""
    out = prefix
    node = data
    for depth, part in enumerate(loc):
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and part < len(node) else None
            out += f"[{part}]"
            if depth == 1 and isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
            continue
        node = node.get(part) if isinstance(node, dict) else None
        out += f".{part}" if out else str(part)
    return out


def message(err: ErrorDetails, root: type[BaseModel], *, beside: list[str] | None = None) -> str:
    """A person's message for a pydantic error of ``root``; ``beside``: the
    other keys allowed next to ``root``'s own at the top level (a plugin's
    options sit beside the workflow keys)."""
    kind, ctx, value = err["type"], err.get("ctx", {}), err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(err["loc"][:-1], root)
        if beside and len(err["loc"]) == 1:
            allowed = [*beside, *allowed]
        return unknown_key(str(err["loc"][-1]), allowed)
    if kind == "missing":
        return f"missing required key '{err['loc'][-1]}'"
    simple = {
        "string_type": "expected a string",
        "int_type": "expected a whole number",
        "int_from_float": "expected a whole number",
        "float_type": "expected a number",
        "float_parsing": "expected a number",
        "list_type": "expected a list",
        "dict_type": "expected a mapping",
        "model_type": "expected a mapping",
        "model_attributes_type": "expected a mapping",
    }
    if kind in simple:
        return f"{simple[kind]}, got {describe(value)}"
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected', '')}, got {describe(value)}"
    if kind in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        return f"must be {'at least' if kind == 'greater_than_equal' else 'more than'} {bound}, got {describe(value)}"
    if kind in ("less_than_equal", "less_than"):
        bound = ctx.get("le", ctx.get("lt"))
        return f"must be {'at most' if kind == 'less_than_equal' else 'less than'} {bound}, got {describe(value)}"
    return str(err["msg"])


def unknown_key(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        return f"unknown key '{key}'; did you mean '{close[0]}'?"
    return f"unknown key '{key}'; allowed keys: {', '.join(allowed)}"


def _allowed_keys(loc: tuple[str | int, ...], root: type[BaseModel]) -> list[str]:
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field else None
    return list(model.model_fields) if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found:
                return found
    return None


def describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__

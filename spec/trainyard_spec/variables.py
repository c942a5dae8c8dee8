"""``.trainyard/variables.yaml`` (or dstack 0.x's ``.dstack/variables.yaml``):
the values of ``${{ variables.NAME }}`` in a workflow's commands::

    variables:
      batch: 32            # every workflow's
      train:               # workflow train's own (wins over the shared ones)
        epochs: 10

Values are scalars, kept as written (``lr: 1.10`` is ``"1.10"``). The CLI
reads the file and sends each workflow's values with the run (``-e NAME=…``
wins over them, in ``planning``); the server never reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from . import _yamltree
from ._messages import describe, unknown_key
from .schema import WorkflowError, WorkflowFileError

VARIABLES_FILES = (".trainyard/variables.yaml", ".dstack/variables.yaml")


class Variables:
    """A validated variables file: shared values and each workflow's own."""

    def __init__(self, *, shared: dict[str, str], by_workflow: dict[str, dict[str, str]]) -> None:
        self.shared = shared
        self.by_workflow = by_workflow

    def of(self, workflow: str) -> dict[str, str]:
        """The values ``workflow`` sees: the shared ones, its own on top."""
        return {**self.shared, **self.by_workflow.get(workflow, {})}


def find_variables_file(root: Path) -> Path | None:
    """The first of VARIABLES_FILES under ``root``, or None."""
    return next((root / name for name in VARIABLES_FILES if (root / name).is_file()), None)


def load_variables(text: str, *, path: str) -> Variables:
    """Parse and validate a variables file; WorkflowFileError lists every problem."""
    try:
        tree = _yamltree.parse_checked(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise WorkflowFileError(
            [WorkflowError(path, line, "yaml", f"invalid YAML: {e.problem or e.context}")]
        ) from None
    errors = [WorkflowError(path, e.line, ".".join(map(str, e.path)) or "(top level)", e.message) for e in tree.errors]
    data = tree.data if isinstance(tree.data, dict) else None
    if data is None or not isinstance(data.get("variables", {}), dict):
        got = describe(tree.data if data is None else data.get("variables"))
        errors.append(
            WorkflowError(path, tree.line_of(("variables",)) or 1, "variables", f"expected a mapping, got {got}")
        )
        raise WorkflowFileError(errors)
    for key in data:
        if key != "variables":
            errors.append(WorkflowError(path, tree.lines[(key,)], key, unknown_key(key, ["variables"])))
    shared: dict[str, str] = {}
    by_workflow: dict[str, dict[str, str]] = {}
    for name, value in (data.get("variables") or {}).items():
        if isinstance(value, dict):
            by_workflow[name] = {k: _value(tree, ("variables", name, k), v, path, errors) for k, v in value.items()}
        else:
            shared[name] = _value(tree, ("variables", name), value, path, errors)
    if errors:
        raise WorkflowFileError(sorted(errors, key=lambda e: e.line or 0))
    return Variables(shared=shared, by_workflow=by_workflow)


def _value(tree: _yamltree.Tree, loc: tuple[str, ...], value: Any, path: str, errors: list[WorkflowError]) -> str:
    if isinstance(value, str):
        return value
    if value is not None and not isinstance(value, list):
        return tree.raw.get(loc, str(value))
    errors.append(WorkflowError(path, tree.line_of(loc), ".".join(loc), f"expected a value, got {describe(value)}"))
    return ""

"""Fencing is written once (``held_by`` in backend/runs/models.py): no other
module filters jobs or attempts by a runner's instance and an attempt number
itself. Checked on the source, so a new site that spells the rule again
fails here, with its file and line."""

from __future__ import annotations

import ast
from pathlib import Path

BACKEND = Path(__file__).resolve().parents[2] / "backend"
HOME = "runs/models.py"
INSTANCE = {"instance", "instance_id", "job__instance", "job__instance_id"}
ATTEMPT = {"attempt", "job__attempt"}
LOOKUPS = {"filter", "exclude", "get"}


def _spellings(tree: ast.AST) -> list[int]:
    """Lines of lookups (``filter``, ``exclude``, ``get``, ``Q``) whose
    keywords name both the instance and the job's current attempt."""
    found = []
    for node in ast.walk(tree):
        func = node.func if isinstance(node, ast.Call) else None
        lookup = (isinstance(func, ast.Attribute) and func.attr in LOOKUPS) or (
            isinstance(func, ast.Name) and func.id == "Q"
        )
        if isinstance(node, ast.Call) and lookup:
            keys = {kw.arg for kw in node.keywords if kw.arg}
            if keys & INSTANCE and keys & ATTEMPT:
                found.append(node.lineno)
    return found


def test_the_current_attempt_rule_is_written_only_in_held_by() -> None:
    offenders = []
    for path in sorted(BACKEND.rglob("*.py")):
        relative = path.relative_to(BACKEND).as_posix()
        if relative == HOME or "/migrations/" in relative:
            continue
        text = path.read_text()
        offenders += [f"{relative}:{line}" for line in _spellings(ast.parse(text))]
        offenders += [f"{relative}: job__attempt" for _ in range(text.count("job__attempt"))]
    assert not offenders, f"use Job.objects.held_by / Attempt.objects.current instead: {offenders}"


def test_the_check_finds_a_spelling() -> None:
    spelled = "Job.objects.filter(pk=job_id, instance_id=instance_id, attempt=attempt)"
    assert _spellings(ast.parse(spelled)) == [1]

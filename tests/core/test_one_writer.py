"""Each status has one writer: ``Instance.status`` only in
``backend/clouds/services/``, Run/Job/Attempt statuses only in
``backend/runs/lifecycle/transitions.py``. Checked on the source: a call that
passes ``status=<SomeStatus>.X`` (``update``, ``create``, …) or an
assignment to ``.status`` anywhere else fails this test."""

from __future__ import annotations

import ast
from pathlib import Path

BACKEND = Path(__file__).resolve().parents[2] / "backend"
WRITERS = {
    "InstanceStatus": ("clouds/services/",),
    "JobStatus": ("runs/lifecycle/transitions.py",),
    "RunStatus": ("runs/lifecycle/transitions.py",),
    "AttemptStatus": ("runs/lifecycle/transitions.py",),
}
WRITE_CALLS = {"update", "create", "get_or_create", "update_or_create", "bulk_create"}


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITE_CALLS:
            for kw in node.keywords:
                if kw.arg == "status" and isinstance(kw.value, ast.Attribute) and isinstance(kw.value.value, ast.Name):
                    found.append((node.lineno, kw.value.value.id))
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute):
            enum = node.value.value
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr == "status" and isinstance(enum, ast.Name):
                    found.append((node.lineno, enum.id))
    return found


def test_every_status_is_written_only_by_its_owner() -> None:
    offenders = []
    for path in sorted(BACKEND.rglob("*.py")):
        relative = path.relative_to(BACKEND).as_posix()
        if "/migrations/" in relative:
            continue
        for line, enum in _writes(ast.parse(path.read_text())):
            owners = WRITERS.get(enum)
            if owners is not None and not relative.startswith(owners):
                offenders.append(f"backend/{relative}:{line} writes a {enum}")
    assert offenders == []


def test_the_check_sees_a_write() -> None:
    code = "Instance.objects.filter(pk=1).update(status=InstanceStatus.IDLE)\njob.status = JobStatus.FAILED\n"
    assert sorted(_writes(ast.parse(code))) == [(1, "InstanceStatus"), (2, "JobStatus")]

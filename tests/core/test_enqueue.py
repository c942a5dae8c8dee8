"""Work is queued one way (backend/core/enqueue.py): by a registered task
name. Every name the backend enqueues is one a worker knows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from celery import current_app
from celery.exceptions import NotRegistered

from backend.core.enqueue import enqueue

BACKEND = Path(__file__).resolve().parents[2] / "backend"


def _enqueue_calls() -> list[tuple[str, int, ast.expr]]:
    """(file, line, first argument) of every ``enqueue(...)`` call in the backend."""
    calls = []
    for path in sorted(BACKEND.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name == "enqueue" and node.args:
                calls.append((str(path.relative_to(BACKEND.parent)), node.lineno, node.args[0]))
    return calls


def test_every_task_name_the_backend_enqueues_is_registered_with_the_worker() -> None:
    current_app.loader.import_default_modules()  # what a worker does at start: the apps' tasks modules
    registered = set(current_app.tasks)
    calls = _enqueue_calls()
    not_literal = [f"{file}:{line}" for file, line, arg in calls if not isinstance(arg, ast.Constant)]
    assert not not_literal, f"enqueue's first argument must be the task's name as a string literal: {not_literal}"
    names = {(file, line, arg.value) for file, line, arg in calls if isinstance(arg, ast.Constant)}
    unknown = [f"{file}:{line}: {name}" for file, line, name in sorted(names) if name not in registered]
    assert not unknown, f"enqueued, but no worker registers these tasks: {unknown}"
    # The scan found the queueing sites it must (a scan that finds nothing would pass above).
    assert {n for _, _, n in names} >= {
        "backend.runs.tasks.schedule",
        "backend.clouds.tasks.instance_launch",
        "backend.clouds.tasks.instance_terminate",
        "backend.clouds.tasks.facts_refresh",
    }


def test_a_name_no_worker_knows_is_refused_at_the_call() -> None:
    with pytest.raises(NotRegistered):
        enqueue("backend.runs.tasks.no_such_task", after_commit=False)
    with pytest.raises(NotRegistered):
        enqueue("backend.no_such_app.tasks.work", after_commit=False)

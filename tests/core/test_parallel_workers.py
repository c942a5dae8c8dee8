"""The suite's xdist workers (tests/support/parallel.py, decision 0068):
each has Redis databases and a data directory no other worker uses."""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests.support.parallel import MAX_WORKERS, pytest_collection_modifyitems, worker_environment
from tests.support.stack import REPO_ROOT

BASE = {"REDIS_URL": "redis://127.0.0.1:6391/0", "TRAINYARD_DATA_DIR": "/data/test"}


def test_a_worker_gets_its_own_redis_databases_and_data_directory() -> None:
    assert worker_environment(BASE, 1) == {
        "REDIS_URL": "redis://127.0.0.1:6391/8",
        "TRAINYARD_E2E_REDIS_DB": "9",
        "TRAINYARD_DATA_DIR": "/data/test/gw1",
    }


def test_no_two_workers_share_a_redis_database_and_all_fit_in_valkeys_16() -> None:
    taken = [0, 5]  # what a run without xdist uses: the URL's database and the stack's default
    for number in range(MAX_WORKERS):
        changed = worker_environment(BASE, number)
        taken += [int(changed["REDIS_URL"].rsplit("/", 1)[1]), int(changed["TRAINYARD_E2E_REDIS_DB"])]
    assert len(taken) == len(set(taken))
    assert max(taken) < 16


@pytest.mark.django_db
def test_this_process_runs_on_its_workers_share() -> None:
    """Under ``make test`` (two workers) the settings this process read are
    its worker's; in one process, the URL as given."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        assert "/gw" not in str(settings.DATA_DIR)
        return
    number = int(worker.removeprefix("gw"))
    assert settings.REDIS_URL.endswith(f"/{6 + 2 * number}")
    assert str(settings.DATA_DIR).endswith(f"/gw{number}")
    assert connection.settings_dict["NAME"].endswith(f"_{worker}")


# Stacks an end-to-end file starts for itself (its own servers, database and
# Redis): a user signed in on one of these is nobody else's.
PRIVATE_STACKS = {"ops_stack", "outage_stack", "scaled"}


def test_each_end_to_end_file_signs_in_users_of_its_own_on_the_shared_stack() -> None:
    """The session's ``stack`` is shared by every end-to-end file a worker
    runs, in an order that depends on the workers: a file that signs in the
    same user as another would find that user's runs and machines (the AWS
    test once counted the checkpoint test's instances). tests/e2e/conftest.py's
    users are the shared ones, and no file assumes theirs are fresh. Any
    receiver counts as the shared stack (``ckpt_stack`` is it, reconfigured)
    except the private stacks above."""
    made = re.compile(r'(\w+)\.issue_token\("([a-z-]+)"\)')
    # A GitHub sign-in makes the user of its login, or login-<id> when that name is taken.
    signed_in = re.compile(r'GithubUser\([^)]*login="([a-z0-9-]+)"')
    files: dict[str, list[str]] = {}
    for path in sorted((REPO_ROOT / "tests" / "e2e").glob("*.py")):
        text = path.read_text()
        names = set(signed_in.findall(text))
        for receiver, name in made.findall(text):
            if receiver in PRIVATE_STACKS:
                assert receiver in _fixtures_starting_a_stack(text), (
                    f"{path.name}: {receiver} is listed as private but no fixture of that name in the file starts a stack"
                )
                continue
            names.add(name)
        for name in names:
            files.setdefault(name, []).append(path.name)
    assert {"alice", "bob", "carol"} <= set(files), "the pattern above is out of date"
    shared = {name: where for name, where in files.items() if len(where) > 1}
    assert not shared, shared


def _fixtures_starting_a_stack(source: str) -> set[str]:
    """The functions of ``source`` that call a ``…Stack(…)`` of their own
    (``Stack``, ``BalancedStack``) or ``balanced_stack(…)``: each starts
    servers with a database of its own."""
    return {
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef)
        and any(
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and (call.func.id.endswith("Stack") or call.func.id == "balanced_stack")
            for call in ast.walk(node)
        )
    }


def test_the_private_stack_rule_needs_a_fixture_that_starts_the_stack() -> None:
    starts = "def ops_stack(tmp):\n    stack = Stack(database_url='x')\n    yield stack\n"
    balanced = "def scaled(tmp):\n    yield BalancedStack(database_url='x')\n"
    helper = "def scaled(tmp):\n    with balanced_stack(tmp, 'x') as stack:\n        yield stack\n"
    mentions = "def ops_stack(stack):\n    return stack  # not a Stack( of its own\n"
    assert _fixtures_starting_a_stack(starts) == {"ops_stack"}
    assert _fixtures_starting_a_stack(balanced) == {"scaled"}
    assert _fixtures_starting_a_stack(helper) == {"scaled"}
    assert _fixtures_starting_a_stack(mentions) == set()


@dataclass
class _Item:
    """What the ordering hook reads of a collected test."""

    path: Path
    name: str
    markers: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.markers else None


def _collected() -> list[Any]:
    return [
        _Item(Path("tests/core/test_a.py"), "one"),
        _Item(Path("tests/e2e/test_b.py"), "fast", set()),
        _Item(Path("tests/core/test_c.py"), "two"),
        _Item(Path("tests/e2e/test_b.py"), "long", {"slow"}),
        _Item(Path("tests/e2e/test_d.py"), "long", {"slow"}),
        _Item(Path("tests/core/test_a.py"), "three"),
    ]


def test_a_worker_collects_the_files_with_a_slow_test_first_each_part_in_its_order() -> None:
    """xdist hands the files out in this order (``--no-loadscope-reorder``):
    the end-to-end files start first. A file with one slow test moves whole."""
    items = _collected()
    pytest_collection_modifyitems(SimpleNamespace(workerinput={}), items)  # type: ignore[arg-type]
    assert [(item.path.name, item.name) for item in items] == [
        ("test_b.py", "fast"),
        ("test_b.py", "long"),
        ("test_d.py", "long"),
        ("test_a.py", "one"),
        ("test_c.py", "two"),
        ("test_a.py", "three"),
    ]


def test_one_process_keeps_the_collected_order() -> None:
    items = _collected()
    pytest_collection_modifyitems(SimpleNamespace(), items)  # type: ignore[arg-type]
    assert items == _collected()


def test_make_test_hands_files_out_in_the_collected_order() -> None:
    """The hook's order is what the workers run only with these options."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "--dist loadfile --no-loadscope-reorder" in makefile


def test_this_worker_collected_its_slow_files_first(request: pytest.FixtureRequest) -> None:
    """The hook ran in this process: under ``make test`` (a worker) no file
    with a slow test comes after one without."""
    if not hasattr(request.config, "workerinput"):
        return  # one process: pytest-django's order, checked above
    slow = {item.path for item in request.session.items if item.get_closest_marker("slow")}
    order = [item.path in slow for item in request.session.items]
    assert order == sorted(order, reverse=True)

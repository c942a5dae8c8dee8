"""The suite's xdist workers (tests/support/parallel.py, decision 0068):
each has Redis databases and a data directory no other worker uses."""

from __future__ import annotations

import os
import re

import pytest
from django.conf import settings
from django.db import connection

from tests.support.parallel import MAX_WORKERS, worker_environment
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
    files: dict[str, list[str]] = {}
    for path in sorted((REPO_ROOT / "tests" / "e2e").glob("*.py")):
        text = path.read_text()
        for receiver, name in made.findall(text):
            if receiver in PRIVATE_STACKS:
                assert "Stack(" in text, f"{path.name}: {receiver} is listed as private but the file starts no stack"
                continue
            files.setdefault(name, []).append(path.name)
    assert {"alice", "bob", "carol"} <= set(files), "the pattern above is out of date"
    shared = {name: where for name, where in files.items() if len(where) > 1}
    assert not shared, shared

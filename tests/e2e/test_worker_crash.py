"""The Celery worker SIGKILLed in the middle of a launch: after its restart
exactly one machine exists for the instance row, and the run finishes.

The fake backend (with real runner processes) is slowed down by its script
(``launch_delay``): the machine and its runner are up, the launch call has
not returned, and the worker dies there, before it recorded anything."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from backend.clouds.backends.fake.state import read_calls
from tests.e2e.conftest import User, run_name_of
from tests.support.stack import Stack

GIB = 2**30
# Price 0 and fewer CPUs than the host: ranked before the local offer.
OFFER = {"instance_type": "fake-tiny", "region": "r1", "price_per_hour": 0, "cpus": 1, "memory_bytes": GIB}

CONNECT = """
from backend.accounts.models import Workspace
from backend.clouds.models import CloudAccount
ws = Workspace.objects.get(slug={slug!r})
CloudAccount.objects.create(workspace=ws, kind="fake", name="fake", config={config!r})
"""

CLEAN_UP = """
from backend.clouds.models import CloudAccount, Instance
from backend.clouds.services.accounts import compute_of
from backend.clouds.services.provisioning import instance_terminate_run
import time
account = CloudAccount.objects.get(workspace__slug={slug!r}, kind="fake")
for _ in range(60):
    retry = [instance_terminate_run(instance_id=str(i.pk)) for i in Instance.objects.filter(account=account)]
    if not any(retry) and not compute_of(account).list_managed():
        break
    time.sleep(0.5)
print(len(compute_of(account).list_managed()))
"""


def _machines(state: Path) -> list[str]:
    return sorted(p.stem for p in (state / "machines").glob("*.json"))


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_worker_killed_during_a_launch_leaves_one_machine_and_the_run_finishes(
    stack: Stack, repo: Path, tmp_path: Path
) -> None:
    carol = User("wendy", stack.issue_token("wendy"), stack)
    state, script = tmp_path / "fake-cloud", tmp_path / "script.json"
    script.write_text(json.dumps({"launch_delay": 8}))
    config = {"state_dir": str(state), "script_file": str(script), "offers": [OFFER], "run_runner": True}
    stack.manage("shell", "-c", CONNECT.format(slug=carol.workspace, config=config))
    try:
        name = run_name_of(carol.cli(repo, "run", "hello", "-d"))
        _wait(lambda: any(c["result"] == "created" for c in read_calls(state)), 60, "the fake launch")

        stack.stop("worker", sig=signal.SIGKILL)  # the launch call is still sleeping
        stack.start("worker")
        run = carol.wait(name, lambda r: r["status"] in ("succeeded", "failed"), timeout=90)

        assert run["status"] == "succeeded", run
        [job] = run["jobs"]
        # One machine ran it (on a loaded machine a lease may run out first: a
        # free retry on the same machine, never a second machine).
        assert job["attempts"][-1]["reason"] == "done"
        assert {a["instance"] for a in job["attempts"]} == {job["instance"]}
        assert len(_machines(state)) == 1
        created = [c for c in read_calls(state) if c["call"] == "launch" and c["result"] == "created"]
        assert len(created) == 1
        assert carol.cli(repo, "logs", name).stdout.startswith("hello from ")
    finally:
        left = stack.manage("shell", "-c", CLEAN_UP.format(slug=carol.workspace)).strip()
    assert left.splitlines()[-1] == "0"  # nothing of ours is left running

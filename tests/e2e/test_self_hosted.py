"""A self-hosted machine, end to end: a real `trainyard-runner register`
against the real stack, a real runner process that takes the one job only it
can run, keeps its identity across a restart, and stops for good when it is
revoked."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import User, commit_all, make_repo, run_name_of
from tests.support.stack import Stack

BIG = """workflows:
  - name: big
    provider: bash
    commands:
      - echo "ran on $(hostname) with $TRAINYARD_JOB_NAME"
    resources:
      cpu: 64
"""
# More than the server's host has: the local backend cannot run it, the registered machine can.
DECLARED = {"cpus": 64, "memory_bytes": 256 * 2**30, "disk_bytes": 500 * 2**30, "gpus": []}


@pytest.fixture(scope="module")
def carol(stack: Stack) -> User:
    return User("selma", stack.issue_token("selma"), stack)


class Runner:
    """One `python -m trainyard_runner` process started from its work dir's runner.json."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.log = work_dir / "runner.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_RUNNER", "TRAINYARD_SERVER"))}
        env["TRAINYARD_RUNNER_RESOURCES"] = json.dumps(DECLARED)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trainyard_runner", "--work-dir", str(self.work_dir)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        os.killpg(self.process.pid, signal.SIGTERM)
        return self.process.wait(timeout=30)

    def wait_connected(self, times: int, timeout: float = 30) -> None:
        """Until the log says this runner connected ``times`` times in all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log.exists() and self.log.read_text().count("trainyard-runner: connected to") >= times:
                return
            time.sleep(0.2)
        raise AssertionError(f"the runner did not connect {times} times: {self.log.read_text()}")

    def wait_exit(self, timeout: float = 30) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Runner]:
    runner = Runner(tmp_path / "machine")
    yield runner
    if runner.process is not None and runner.process.poll() is None:
        os.killpg(runner.process.pid, signal.SIGKILL)
        runner.process.wait()
    assert runner.process is None or runner.process.poll() is not None  # nothing of ours left running


def _register(work_dir: Path, url: str, token: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainyard_runner", "register", "--url", url, "--token", token,
         "--work-dir", str(work_dir), *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _runners(user: User) -> list[dict[str, Any]]:
    answer = user.api("GET", f"/api/v1/workspaces/{user.workspace}/runners/")
    assert answer.status_code == 200, answer.text
    return list(answer.json())


def _wait_status(user: User, status: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _runners(user)
        if found and found[0]["status"] == status:
            return found[0]
        time.sleep(0.3)
    raise AssertionError(f"the runner did not become {status}: {_runners(user)}")


def test_a_registered_machine_takes_the_job_keeps_its_identity_and_stops_when_revoked(
    carol: User, tmp_path: Path, machine: Runner
) -> None:
    ws = carol.workspace
    made = carol.api("POST", f"/api/v1/workspaces/{ws}/runners/registration-tokens/", json={"note": "lab"})
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    listed = carol.api("GET", f"/api/v1/workspaces/{ws}/runners/registration-tokens/")
    assert token not in listed.text and listed.json()[0]["state"] == "unused"

    registered = _register(machine.work_dir, carol.stack.url, token, "--name", "lab-box")

    assert registered.returncode == 0, registered.stderr
    assert "Registered this machine as lab-box" in registered.stdout
    assert f"trainyard-runner --work-dir {machine.work_dir}" in registered.stdout
    config = machine.work_dir / "runner.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert json.loads(config.read_text())["name"] == "lab-box"
    again = _register(tmp_path / "other", carol.stack.url, token)
    assert again.returncode == 2 and "This registration token is used" in again.stderr

    machine.start()
    first = _wait_status(carol, "idle")
    assert (first["name"], first["cpus"]) == ("lab-box", 64)

    repo = make_repo(tmp_path / "tiny-train")
    (repo / ".trainyard" / "workflows.yaml").write_text(BIG)
    commit_all(repo, "big")
    name = run_name_of(carol.cli(repo, "run", "big", "-d"))
    run = carol.wait(name, lambda r: r["status"] in {"succeeded", "failed"}, timeout=90)
    assert run["status"] == "succeeded", run
    assert run["jobs"][0]["instance"] == "lab-box"

    # A restart while idle: the same row, the same token, no new machine.
    assert machine.stop() == 0
    machine.start()
    machine.wait_connected(2)  # the row is still idle from before: wait for the new connection itself
    back = _wait_status(carol, "idle")
    assert back["id"] == first["id"] and len(_runners(carol)) == 1

    revoked = carol.api("POST", f"/api/v1/workspaces/{ws}/runners/{first['id']}/revoke/")
    assert revoked.status_code == 204
    assert machine.wait_exit() == 2
    assert "lab-box was revoked" in machine.log.read_text()

    machine.start()  # a revoked runner that starts again is refused at once, and says why
    assert machine.wait_exit() == 2
    assert machine.log.read_text().count("lab-box was revoked") == 2
    assert [r["revoked"] for r in _runners(carol)] == [True]

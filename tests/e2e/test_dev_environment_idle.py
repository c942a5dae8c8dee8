"""A dev environment no one enters stops after its ``inactivity_duration``
and its machine is released, with a real local runner and the beat's pass
(every second in the test stack: TRAINYARD_DEV_IDLE_CHECK_SECONDS); a live
SSH session (the stock client through the relay, as VS Code's Remote-SSH
holds one) keeps it up, and its end starts the idle time."""

from __future__ import annotations

import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import User, commit_all, run_name_of
from tests.e2e.test_access_ssh import _client

WORKFLOWS = """workflows:
  - name: ide
    provider: code
    inactivity_duration: 5s
    idle_duration: 0
"""


def test_an_idle_dev_environment_stops_and_its_machine_is_released(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    commit_all(repo, "a dev environment that idles")
    started = alice.cli(repo, "run", "ide", "--detach")
    assert started.returncode == 0, started.stderr
    name = run_name_of(started)
    running = alice.wait(name, lambda r: _job(r)["status"] == "running", 120)
    instance = _job(running)["instance"]

    final = alice.wait(name, lambda r: r["status"] in ("stopped", "failed", "succeeded"), 60)
    released = _instance_when(alice, instance, lambda i: i["status"] in ("terminated", "lost"), 60)
    logs = alice.cli(repo, "logs", name).stdout

    job = _job(final)
    assert (final["status"], job["status"], job["status_reason"]) == (
        "stopped",
        "stopped",
        "stopped: idle for 5s (inactivity_duration)",
    )
    idle = _at(job["finished_at"]) - _at(job["started_at"])
    assert 5 <= idle.total_seconds() < 30, job
    assert released["status"] == "terminated", released
    assert f"code --remote ssh-remote+trainyard-{name} " in logs, logs


@pytest.mark.skipif(not shutil.which("ssh"), reason="needs the stock OpenSSH client (openssh-client)")
def test_a_live_ssh_session_keeps_a_dev_environment_up_and_its_end_starts_the_idle_time(
    alice: User, repo: Path, tmp_path: Path
) -> None:
    client = _client(alice, tmp_path, alice.workspace)
    added = client.cli("ssh-key", "add")
    assert added.returncode == 0 or "You have this key already" in added.stderr, added.stderr
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS.replace("5s", "10s"))
    commit_all(repo, "a dev environment someone works in")
    name = run_name_of(alice.cli(repo, "run", "ide", "--detach"))
    alice.wait(name, lambda r: _job(r)["status"] == "running", 120)
    configured = client.cli("ssh-config")
    assert configured.returncode == 0, configured.stderr

    worked = client.ssh(f"trainyard-{name}", "sleep 20; echo worked", timeout=90)
    after_session = _job(alice.run(name))["status"]
    final = alice.wait(name, lambda r: r["status"] in ("stopped", "failed", "succeeded"), 60)

    assert (worked.returncode, worked.stdout) == (0, "worked\n"), worked.stderr
    assert after_session == "running"  # 20 s of session, twice its inactivity_duration
    job = _job(final)
    assert job["status_reason"] == "stopped: idle for 10s (inactivity_duration)"
    assert (_at(job["finished_at"]) - _at(job["started_at"])).total_seconds() >= 28, job


def _job(run: dict[str, Any]) -> dict[str, Any]:
    [job] = run["jobs"]
    return job


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _instance_when(alice: User, name: str, until: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        rows = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/instances/?all=1").json()
        rows = rows["results"] if isinstance(rows, dict) else rows
        found = next(i for i in rows if i["name"] == name)
        if until(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)

"""Pending with a reason, stop, and a runner that dies mid-job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.e2e.conftest import User, run_name_of

WORKFLOWS = """workflows:
  - name: needs-v100
    provider: bash
    commands: [nvidia-smi]
    resources:
      gpu: {name: V100, count: 1}
  - name: sleepy
    provider: bash
    commands:
      - echo started
      - sleep $NAP & sleep $((NAP + 1))
"""


def _sleeps(nap: int) -> list[str]:
    """pids of the job's two sleeps (exact command lines, not bash's script)."""
    pattern = f"^sleep ({nap}|{nap + 1})$"
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


def _wait_gone(nap: int) -> None:
    deadline = time.monotonic() + 10
    while _sleeps(nap) and time.monotonic() < deadline:
        time.sleep(0.2)


def _running(alice: User, repo: Path, nap: int) -> str:
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    name = run_name_of(alice.cli(repo, "run", "sleepy", "-d", "-e", f"NAP={nap}"))
    alice.wait(name, lambda r: r["status"] == "running" and r["jobs"][0]["last_seq"] >= 1)
    return name


def test_impossible_resources_wait_with_a_reason_shown_by_ps(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    name = run_name_of(alice.cli(repo, "run", "needs-v100", "-d"))

    run = alice.wait(name, lambda r: "no backend" in r["status_reason"])
    ps = alice.cli(repo, "ps", "--json")

    assert run["status"] == "pending"
    assert "1× V100 requested" in run["status_reason"]
    assert "1× V100 requested" in next(r for r in json.loads(ps.stdout) if r["name"] == name)["status_reason"]
    alice.cli(repo, "stop", name)
    assert alice.run(name)["status"] == "stopped"


def test_stop_kills_the_whole_process_tree_and_marks_the_run_stopped(alice: User, repo: Path) -> None:
    name = _running(alice, repo, nap=417)
    assert len(_sleeps(417)) == 2

    result = alice.cli(repo, "stop", name)
    run = alice.wait(name, lambda r: r["status"] == "stopped", timeout=30)

    assert result.returncode == 0, result.stderr
    assert run["jobs"][0]["status"] == "stopped"
    _wait_gone(417)
    assert _sleeps(417) == []


def test_a_runner_killed_mid_job_fails_the_job_with_a_reason(alice: User, repo: Path) -> None:
    name = _running(alice, repo, nap=427)
    instance = alice.run(name)["jobs"][0]["instance"]
    pidfiles = list((alice.stack.data_dir / "local-runners").glob("*.pid"))
    pids = [int(p.read_text()) for p in pidfiles]
    [job_sleep, _] = _sleeps(427)
    runner_pid = next(pid for pid in pids if _is_ancestor(pid, int(job_sleep)))
    killed_at = time.monotonic()

    os.kill(runner_pid, signal.SIGKILL)
    run = alice.wait(name, lambda r: r["status"] == "failed", timeout=30)

    assert time.monotonic() - killed_at < 30
    assert run["jobs"][0]["status_reason"] == f"runner {instance} stopped responding (no heartbeat for 5s)"
    _wait_gone(427)
    assert _sleeps(427) == []  # the whole job died with its runner


def _is_ancestor(ancestor: int, pid: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False

"""Pending with a reason, stop, and a runner that dies mid-job."""

from __future__ import annotations

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
      - sleep 417 & sleep 418
"""


def _procs(pattern: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return out.split()


def _running(alice: User, repo: Path) -> str:
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    name = run_name_of(alice.cli(repo, "run", "sleepy", "-d"))
    alice.wait(name, lambda r: r["status"] == "running" and r["jobs"][0]["last_seq"] >= 1)
    return name


def test_impossible_resources_wait_with_a_reason_shown_by_ps(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    name = run_name_of(alice.cli(repo, "run", "needs-v100", "-d"))

    run = alice.wait(name, lambda r: "no backend" in r["status_reason"])
    ps = alice.cli(repo, "ps", "--json")

    assert run["status"] == "pending"
    assert "1× V100 requested" in run["status_reason"]
    assert "1× V100 requested" in next(r for r in __import__("json").loads(ps.stdout) if r["name"] == name)["status_reason"]
    alice.cli(repo, "stop", name)
    assert alice.run(name)["status"] == "stopped"


def test_stop_kills_the_whole_process_tree_and_marks_the_run_stopped(alice: User, repo: Path) -> None:
    name = _running(alice, repo)
    assert len(_procs("sleep 41[78]")) == 2

    result = alice.cli(repo, "stop", name)
    run = alice.wait(name, lambda r: r["status"] == "stopped", timeout=30)

    assert result.returncode == 0, result.stderr
    assert run["jobs"][0]["status"] == "stopped"
    deadline = time.monotonic() + 10
    while _procs("sleep 41[78]") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _procs("sleep 41[78]") == []


def test_a_runner_killed_mid_job_fails_the_job_with_a_reason(alice: User, repo: Path) -> None:
    name = _running(alice, repo)
    instance = alice.run(name)["jobs"][0]["instance"]
    pidfiles = list((alice.stack.data_dir / "local-runners").glob("*.pid"))
    pids = [int(p.read_text()) for p in pidfiles]
    runner_pid = next(pid for pid in pids if _runs_job(pid))
    killed_at = time.monotonic()

    os.kill(runner_pid, signal.SIGKILL)
    run = alice.wait(name, lambda r: r["status"] == "failed", timeout=30)

    assert time.monotonic() - killed_at < 30
    assert run["jobs"][0]["status_reason"] == f"runner {instance} stopped responding (no heartbeat for 5s)"
    deadline = time.monotonic() + 10
    while _procs("sleep 41[78]") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _procs("sleep 418") == []  # bash's direct child died with the runner


def _runs_job(pid: int) -> bool:
    """The runner whose process tree holds the sleepy job."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return any(
        "sleep 41" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
        or _runs_job(int(c))
        for c in children
        if Path(f"/proc/{c}").exists()
    )

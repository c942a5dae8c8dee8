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
  - name: resumable
    provider: bash
    commands:
      - echo "attempt=$TRAINYARD_ATTEMPT resumed=$TRAINYARD_RESUMED"
      - if [ "$TRAINYARD_ATTEMPT" = 1 ]; then sleep $NAP & sleep $((NAP + 1)); fi
      - echo finished
  - name: once
    provider: bash
    retry: {limit: 1}
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


def _kill_the_runner_of(alice: User, nap: int) -> str:
    """SIGKILL the runner process whose job runs ``sleep <nap>``; its instance name."""
    pidfiles = list((alice.stack.data_dir / "local-runners").glob("*.pid"))
    pids = [int(p.read_text().split()[0]) for p in pidfiles]
    [job_sleep, _] = _sleeps(nap)
    runner_pid = next(pid for pid in pids if _is_ancestor(pid, int(job_sleep)))
    os.kill(runner_pid, signal.SIGKILL)
    return str(runner_pid)


def test_a_runner_killed_mid_job_is_retried_on_a_new_runner(alice: User, repo: Path) -> None:
    """Attempt 1 ends instance_lost (the backend says the process is gone),
    attempt 2 runs on another runner with TRAINYARD_ATTEMPT=2, the run
    succeeds, and the one log shows both attempts in order."""
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    name = run_name_of(alice.cli(repo, "run", "resumable", "-d", "-e", "NAP=437"))
    alice.wait(name, lambda r: r["status"] == "running" and r["jobs"][0]["last_seq"] >= 1)
    first_instance = alice.run(name)["jobs"][0]["instance"]
    killed_at = time.monotonic()

    _kill_the_runner_of(alice, 437)
    run = alice.wait(name, lambda r: r["status"] in ("succeeded", "failed"), timeout=90)

    job = run["jobs"][0]
    assert run["status"] == "succeeded", run
    assert time.monotonic() - killed_at < 60
    assert [(a["number"], a["reason"]) for a in job["attempts"]] == [(1, "instance_lost"), (2, "done")]
    assert job["attempts"][0]["instance"] == first_instance != job["attempts"][1]["instance"]
    assert "is gone" in job["attempts"][0]["message"]
    lines = [line for line in alice.cli(repo, "logs", name).stdout.splitlines() if line.strip()]
    assert lines[0] == f"--- attempt 1 of resumable on {first_instance} ---"
    boundary = lines.index(f"--- attempt 2 of resumable on {job['attempts'][1]['instance']} ---")
    assert lines[boundary - 1].startswith("--- attempt 1 ended: instance_lost (machine ")
    assert lines[-2:] == ["attempt=2 resumed=1", "finished"]
    assert [line for line in lines if line.startswith("attempt=")] == ["attempt=1 resumed=", "attempt=2 resumed=1"]
    _wait_gone(437)
    assert _sleeps(437) == []


def test_with_retry_limit_1_a_killed_runner_fails_the_run_with_the_reason(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    name = run_name_of(alice.cli(repo, "run", "once", "-d", "-e", "NAP=447"))
    alice.wait(name, lambda r: r["status"] == "running" and r["jobs"][0]["last_seq"] >= 1)
    instance = alice.run(name)["jobs"][0]["instance"]

    _kill_the_runner_of(alice, 447)
    run = alice.wait(name, lambda r: r["status"] == "failed", timeout=60)

    job = run["jobs"][0]
    assert [(a["number"], a["reason"]) for a in job["attempts"]] == [(1, "instance_lost")]
    assert job["status_reason"].startswith(f"machine {instance} is gone")
    assert job["status_reason"].endswith("not retried: 1 of 1 attempts used (retry: limit)")
    _wait_gone(447)
    assert _sleeps(447) == []


def _is_ancestor(ancestor: int, pid: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False

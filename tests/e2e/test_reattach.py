"""A runner process that dies and is started again on the same machine (same
token, same work dir) re-attaches to the job it was running: one attempt, the
commands run once, every log line stored once, in order.

The fake backend's machines survive their runner, like cloud VMs, and its
runners run with --jobs-outlive-runner. The test SIGKILLs a machine's runner
and starts it again itself, with the command line and environment the
backend gave it, as systemd would restart a crashed runner."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import User, run_name_of
from tests.e2e.test_worker_crash import CLEAN_UP, CONNECT, OFFER
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

WORKFLOWS = """workflows:
  - name: counting
    provider: bash
    commands:
      - echo "ran attempt $TRAINYARD_ATTEMPT" >> "$MARKER"
      - for i in $(seq 1 $LINES); do echo "line $i"; sleep $PAUSE; done
"""


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _the_runner(state: Path) -> tuple[Path, int]:
    [pidfile] = (state / "runners").glob("*.pid")
    return pidfile, int(pidfile.read_text().split()[0])


def _kill(pid: int) -> tuple[list[str], dict[str, str]]:
    """SIGKILL the runner; its command line and environment, read first."""
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 5, "the runner to die")
    return argv, env


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _restart(pidfile: Path, argv: list[str], env: dict[str, str]) -> None:
    """Start the runner again as the backend did, and record its pid where the backend looks."""
    with open(pidfile.with_suffix(".log"), "ab") as log:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    tmp = pidfile.with_suffix(".pid.tmp")
    tmp.write_text(f"{proc.pid}\n")
    os.replace(tmp, pidfile)


def _shims(state: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", "_shim.py"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(state) in line]


def _scenario(
    stack: Stack, repo: Path, tmp_path: Path, username: str, *, lines: int, pause: float, finish_first: bool
) -> None:
    user = User(username, stack.issue_token(username), stack)
    state, marker = tmp_path / "fake-cloud", tmp_path / "marker"
    config = {"state_dir": str(state), "offers": [OFFER], "run_runner": True}
    stack.manage("shell", "-c", CONNECT.format(slug=user.workspace, config=config))
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    try:
        env = ["-e", f"MARKER={marker}", "-e", f"LINES={lines}", "-e", f"PAUSE={pause}"]
        name = run_name_of(user.cli(repo, "run", "counting", "-d", *env))
        user.wait(name, lambda r: r["status"] == "running" and r["jobs"][0]["last_seq"] >= 3, timeout=90)
        job_id = user.run(name)["jobs"][0]["id"]
        pidfile, pid = _the_runner(state)
        argv, runner_env = _kill(pid)
        job_dir = Path(runner_env["TRAINYARD_RUNNER_DIR"]) / "jobs" / job_id
        if finish_first:  # the job ends while no runner watches it
            _wait(lambda: (job_dir / "exit.json").exists(), 60, "the job to end without its runner")
        else:
            time.sleep(3)
            assert not (job_dir / "exit.json").exists()
        _restart(pidfile, argv, runner_env)
        run = user.wait(name, lambda r: r["status"] in ("succeeded", "failed"), timeout=120)

        assert run["status"] == "succeeded", run
        [job] = run["jobs"]
        assert [(a["number"], a["reason"]) for a in job["attempts"]] == [(1, "done")]
        assert marker.read_text() == "ran attempt 1\n"  # the commands ran once
        logged = [line for line in user.cli(repo, "logs", name).stdout.splitlines() if line.startswith("line ")]
        assert logged == [f"line {i}" for i in range(1, lines + 1)]
    finally:
        left = stack.manage("shell", "-c", CLEAN_UP.format(slug=user.workspace)).strip()
    assert left.splitlines()[-1] == "0"  # nothing of ours is left running
    _wait(lambda: not _shims(state), 10, "no shim left")


def test_a_runner_sigkilled_mid_job_and_restarted_re_attaches_to_it(stack: Stack, repo: Path, tmp_path: Path) -> None:
    _scenario(stack, repo, tmp_path, "reattach-mid", lines=30, pause=1, finish_first=False)


def test_a_job_that_ends_while_its_runner_is_down_is_reported_by_the_restarted_runner(
    stack: Stack, repo: Path, tmp_path: Path
) -> None:
    _scenario(stack, repo, tmp_path, "reattach-end", lines=8, pause=0.5, finish_first=True)

"""A job of the local backend's root runners runs as a user of its own
(docs/RUNNER.md, "The job's user"): it cannot read the server's secrets or
its runner's token, and nothing it starts outlives it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import User, run_name_of
from tests.support.stack import Stack

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a job gets a user of its own only under a root runner")

WORKFLOWS = """workflows:
  - name: snoop
    provider: bash
    commands:
      - if tr '\\0' '\\n' < /proc/$WEB_PID/environ; then echo 'READ web environ'; else echo 'DENIED web environ'; fi
      - if tr '\\0' '\\n' < /proc/$WORKER_PID/environ; then echo 'READ worker environ'; else echo 'DENIED worker environ'; fi
      - RUNNER=$(cut -d' ' -f4 /proc/$PPID/stat)
      - if tr '\\0' '\\n' < /proc/$RUNNER/environ; then echo 'READ runner environ'; else echo 'DENIED runner environ'; fi
      - if ls ../../..; then echo 'READ runner dir'; else echo 'DENIED runner dir'; fi
  - name: escape
    provider: bash
    commands:
      - trap '' TERM
      - setsid env -i sleep 1000.125 > /dev/null 2>&1 &
      - echo escaped
      - while :; do sleep 0.1 || true; done
"""
ESCAPED = b"sleep\x001000.125\x00"


def _escaped() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            live = entry.name.isdigit() and (entry / "cmdline").read_bytes() == ESCAPED
            if live and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_job_that_tries_to_read_the_servers_or_its_runners_environ_fails(
    alice: User, repo: Path, stack: Stack
) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    pids = ("-e", f"WEB_PID={stack.pid('web')}", "-e", f"WORKER_PID={stack.pid('worker')}")
    name = run_name_of(alice.cli(repo, "run", "snoop", "-d", *pids))
    run = alice.wait(name, lambda r: r["status"] in {"succeeded", "failed"}, timeout=120)
    printed = alice.cli(repo, "logs", name).stdout.splitlines()

    assert run["status"] == "succeeded"
    assert [line for line in printed if line.startswith(("READ", "DENIED"))] == [
        "DENIED web environ",
        "DENIED worker environ",
        "DENIED runner environ",
        "DENIED runner dir",
    ]
    assert not any(
        line.startswith(("DATABASE_URL=", "DJANGO_SECRET_KEY=", "TRAINYARD_RUNNER_TOKEN=")) for line in printed
    )


def test_a_job_that_runs_setsid_env_i_sleep_leaves_nothing_behind_when_stopped(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    name = run_name_of(alice.cli(repo, "run", "escape", "-d"))
    alice.wait(name, lambda r: r["status"] == "running" and r["jobs"][0]["last_seq"] >= 1, timeout=120)
    deadline = time.monotonic() + 10
    while not _escaped() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _escaped(), "the escaping sleep never started"

    alice.cli(repo, "stop", name)
    alice.wait(name, lambda r: r["status"] == "stopped", timeout=60)
    deadline = time.monotonic() + 5
    while _escaped() and time.monotonic() < deadline:
        time.sleep(0.1)

    assert _escaped() == []

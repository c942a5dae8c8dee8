"""A burst of scheduling requests does not pile up tasks or passes: 200
requests while runs are submitted enqueue a handful of ``schedule`` tasks
and run a handful of passes on the real worker, and every job is scheduled
and runs (backend/runs/services/coalesce.py)."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import User, run_name_of
from tests.support.stack import Stack

BURST = """
import time
from backend.core.redis import redis_client
from backend.runs.services.coalesce import DIRTY_KEY, PASSES_KEY, QUEUED_KEY, schedule_request
r = redis_client()
before = int(r.get(PASSES_KEY) or 0)
enqueued = sum(schedule_request() for _ in range(200))
deadline = time.monotonic() + 60
while (r.exists(DIRTY_KEY) or r.exists(QUEUED_KEY)) and time.monotonic() < deadline:
    time.sleep(0.05)
print("burst", enqueued, int(r.get(PASSES_KEY) or 0) - before)
"""


def test_two_hundred_requests_run_few_passes_and_every_job_runs(stack: Stack, repo: Path) -> None:
    erin = User("erin", stack.issue_token("erin"), stack)
    names = [run_name_of(erin.cli(repo, "run", "hello", "-d")) for _ in range(3)]

    # Django's shell also prints how many objects it imported, before or after ours.
    out = next(line.split() for line in stack.manage("shell", "-c", BURST).splitlines() if line.startswith("burst "))
    enqueued, passes = int(out[1]), int(out[2])

    assert enqueued <= 10, out  # one task waits at a time, not 200
    assert 1 <= passes <= 10, out
    for name in names:
        run = erin.wait(name, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=120)
        assert run["status"] == "succeeded", run

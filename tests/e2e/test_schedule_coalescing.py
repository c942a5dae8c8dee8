"""A burst of scheduling requests does not pile up tasks or passes
(backend/runs/wakeups.py), on the real worker:

- 200 requests while runs are submitted lose none: every job is scheduled
  and runs;
- 200 requests while the worker is frozen enqueue exactly one ``schedule``
  task (at most one waits), and when the worker thaws that one task runs
  the pass for all of them.

How many passes a burst costs while the worker keeps up depends on how fast
the burst comes compared with a pass, which on a loaded machine is anything;
so the count is asserted where it is deterministic, with the worker frozen.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import User, run_name_of
from tests.support.stack import Stack

REQUESTS = """
from backend.core.redis import redis_client
from backend.runs.wakeups import PASSES_KEY, schedule_request
print("burst", int(redis_client().get(PASSES_KEY) or 0), sum(schedule_request() for _ in range(200)))
"""

SETTLED = """
import time
from backend.core.redis import redis_client
from backend.runs.wakeups import DIRTY_KEY, PASSES_KEY, QUEUED_KEY
r = redis_client()
deadline = time.monotonic() + 60
while (r.exists(DIRTY_KEY) or r.exists(QUEUED_KEY)) and time.monotonic() < deadline:
    time.sleep(0.05)
print("settled", int(r.get(PASSES_KEY) or 0), int(r.exists(DIRTY_KEY) or r.exists(QUEUED_KEY)))
"""


def shell(stack: Stack, script: str, marker: str) -> list[int]:
    # Django's shell also prints how many objects it imported, before or after ours.
    out = stack.manage("shell", "-c", script).splitlines()
    return [int(word) for word in next(line.split() for line in out if line.startswith(marker + " "))[1:]]


def test_requests_during_submissions_lose_no_job(stack: Stack, repo: Path) -> None:
    erin = User("cole", stack.issue_token("cole"), stack)
    names = [run_name_of(erin.cli(repo, "run", "hello", "-d")) for _ in range(3)]
    _, enqueued = shell(stack, REQUESTS, "burst")
    assert 1 <= enqueued < 200
    for name in names:
        run = erin.wait(name, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=120)
        assert run["status"] == "succeeded", run


def test_a_burst_while_the_worker_is_frozen_queues_one_task_and_runs_one_pass(stack: Stack) -> None:
    _, pending = shell(stack, SETTLED, "settled")
    assert pending == 0, "requests from before the test were still pending after 60 s"
    stack.pause("worker")
    try:
        before, enqueued = shell(stack, REQUESTS, "burst")
    finally:
        stack.resume("worker")
    assert enqueued == 1  # the first request queued the task; 199 found it waiting
    after, pending = shell(stack, SETTLED, "settled")
    assert pending == 0, "the queued task did not run within 60 s of the worker thawing"
    # One pass for the 200 requests. The stack is shared with other tests and
    # the beat kept sending while the worker was frozen: a reconcile that
    # finds something, or another test's runner ending, may ask for one more.
    assert 1 <= after - before <= 3, (before, after)

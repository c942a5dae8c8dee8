"""A task that kills its Celery worker every time is parked after
TRAINYARD_TASK_MAX_DELIVERIES (3) deaths instead of being redelivered
forever, and what it was working on fails with an internal-error reason.

The stack's test hook (TRAINYARD_TEST_CRASH_SUBJECTS) makes the scheduling
pass ``os._exit`` its worker process when it reaches the listed job, as a
crash in a native library would: the real prefork worker loses its child,
and the message comes back (acks_late, reject_on_worker_lost)."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import User, commit_all, run_name_of
from tests.support.stack import Stack

# A job no backend of the stack can run (no GPU): it stays pending, so each
# scheduling pass reaches it again.
WORKFLOWS = """\
workflows:
  - name: hello
    provider: bash
    commands:
      - echo hello
  - name: gpu
    provider: bash
    commands:
      - echo never
    resources:
      gpu: {name: V100, count: 1}
"""

PARKED = """
from backend.core.models import ParkedTask
for p in ParkedTask.objects.filter(subject={subject!r}):
    print("parked", p.task_name, p.deaths, p.outcome)
"""


def test_a_task_that_kills_its_worker_is_parked_and_its_job_fails(stack: Stack, repo: Path) -> None:
    dora = User("parker", stack.issue_token("parker"), stack)
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    commit_all(repo, "a job that waits")
    crash = stack.data_dir / "crash-subjects"
    name = run_name_of(dora.cli(repo, "run", "gpu", "-d"))
    run = dora.wait(name, lambda r: "no backend can run" in r["jobs"][0]["status_reason"])
    job_id = run["jobs"][0]["id"]
    worker_log = stack.logs_dir / "worker.log"
    try:
        crash.write_text(f"job:{job_id}\n")

        run = dora.wait(name, lambda r: r["status"] != "pending", timeout=180)

        assert run["status"] == "failed", run
        [job] = run["jobs"]
        assert job["status"] == "failed"
        assert job["status_reason"].startswith("internal error: task schedule ["), job
        assert "killed its worker 3 times; it was parked while scheduling this job" in job["status_reason"]
        assert worker_log.read_text().count(f"dies on job:{job_id}") >= 3
        parked = stack.manage("shell", "-c", PARKED.format(subject=f"job:{job_id}")).split("\n")
        assert any(line.startswith("parked backend.runs.tasks.schedule 3 job ") for line in parked), parked
    finally:
        crash.write_text("")
    # The worker serves on: the next run is scheduled and runs.
    after = run_name_of(dora.cli(repo, "run", "hello", "-d"))
    assert dora.wait(after, lambda r: r["status"] in ("succeeded", "failed"), timeout=90)["status"] == "succeeded"

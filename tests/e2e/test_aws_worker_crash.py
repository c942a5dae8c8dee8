"""The Celery worker SIGKILLed around RunInstances on AWS, end to end: the
stack, moto's server over HTTP and the boot of its instances
(tests/support/ec2boot.py), a workspace of its own with an aws account.

moto's wrapper slows one call down (``MotoServer.delay``): the worker is
killed while that call is in flight, and restarted. What the launch task
left undone is done again (the task redelivered, or the reconciler's
relaunch of a row with no launch recorded), and the backend's launch adopts
the machine that carries the row's key instead of starting another:

(a) killed during RunInstances (moto still launches the machine after the
    client is gone): one instance, adopted by its tag, runs the job;
(b) killed during the look-up by tag that precedes RunInstances (nothing
    launched yet): one instance, never two, runs the job.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import User, commit_all, connect_aws, run_name_of
from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack
from tests.support.waiting import wait_for as _wait

pytestmark = pytest.mark.slow

BUCKET = "ty-e2e-aws-crash"
DELAY = 12.0
ADOPT_LOOKUP = {"Filter.Name": "tag:trainyard:key"}
WORKFLOW = """\
workflows:
  - name: hello
    provider: bash
    commands:
      - echo hello from $(hostname)
    backends: [aws]
    spot_policy: spot
    idle_duration: 5s
"""

ROWS = """
from backend.clouds.models import Instance
for i in Instance.objects.filter(workspace__slug={slug!r}, backend="aws").order_by("created_at"):
    print("row", i.pk, i.status, i.backend_id or "-", i.idempotency_key, i.termination_reason or "-")
"""

CLEAN_UP = """
import time
from backend.clouds.models import CloudAccount, Instance, InstanceReason
from backend.clouds.services.instances import instance_request_termination
from backend.clouds.services.provisioning import instance_terminate_run
for account in CloudAccount.objects.filter(workspace__slug={slug!r}, kind="aws"):
    rows = list(Instance.objects.filter(account=account))
    for row in rows:
        instance_request_termination(instance_id=str(row.pk), reason=InstanceReason.TERMINATED, message="test ended")
    for _ in range(60):
        if not any([instance_terminate_run(instance_id=str(row.pk)) for row in rows]):
            break
        time.sleep(0.5)
"""


def _rows(stack: Stack, user: User) -> list[list[str]]:
    out = stack.manage("shell", "-c", ROWS.format(slug=user.workspace))
    return [line.split() for line in out.splitlines() if line.startswith("row ")]


def _connect(user: User, repo: Path, aws: MotoServer) -> None:
    connect_aws(user, repo, aws, bucket=BUCKET)
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOW)
    commit_all(repo, "hello on AWS spot")


def _crash_and_finish(
    stack: Stack,
    aws: MotoServer,
    ec2_boot: Ec2Boot,
    user: User,
    repo: Path,
    *,
    action: str,
    when: dict[str, str] | None = None,
) -> None:
    """Slow one call down, start a run, SIGKILL the worker while the call is
    in flight, restart it; the run must finish on exactly one machine."""
    _connect(user, repo, aws)
    aws.delay(action, DELAY, when=when)
    try:
        name = run_name_of(user.cli(repo, "run", "hello", "-d"))
        _wait("the slowed call", lambda: aws.delay_hits(action) >= 1, 90)
        time.sleep(1.0)  # the worker is inside the call now
        stack.stop("worker", sig=signal.SIGKILL)
        counted_at_kill = len(aws.our_instances())
        stack.start("worker")

        run = user.wait(name, lambda r: r["status"] in ("succeeded", "failed"), timeout=300)

        assert run["status"] == "succeeded", (run, _rows(stack, user))
        ours = aws.our_instances()
        rows = _rows(stack, user)
        assert len(ours) == 1, (ours, rows)
        assert len(rows) == 1, rows  # one row for the job, never a second launch
        [row] = rows
        # The machine is the row's (its key tag), and the row knows its cloud
        # id: from the recorded launch, or, when the runner's hello came
        # before the relaunch could record it, from the hello (Hello.cloud).
        tags = {t["Key"]: t["Value"] for t in ours[0]["Tags"]}
        assert tags["trainyard:key"] == row[4]
        assert row[3] == ours[0]["InstanceId"], (row, ours)
        assert ours[0]["InstanceId"] in ec2_boot.booted
        [job] = run["jobs"]
        assert {a["instance"] for a in job["attempts"]} == {job["instance"]}
        assert counted_at_kill <= 1
        # Nothing launched a second machine later either.
        assert len(aws.our_instances(states=("pending", "running", "stopping", "stopped", "shutting-down"))) <= 1
    finally:
        stack.manage("shell", "-c", CLEAN_UP.format(slug=user.workspace))
        _wait("our instances to end in moto", lambda: not aws.our_instances(), 60)
        removed = user.cli(repo, "backend", "rm", "aws")
        assert removed.returncode == 0, removed.stderr + removed.stdout


def test_a_worker_killed_during_run_instances_leaves_one_adopted_instance_and_the_run_finishes(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, repo: Path
) -> None:
    dora = User("dora", stack.issue_token("dora"), stack)
    _crash_and_finish(stack, aws, ec2_boot, dora, repo, action="RunInstances")


def test_a_worker_killed_before_run_instances_leaves_one_instance_never_two(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, repo: Path
) -> None:
    erin = User("erin", stack.issue_token("erin"), stack)
    # The launch's look-up by key (adopt a machine already there), before RunInstances.
    _crash_and_finish(stack, aws, ec2_boot, erin, repo, action="DescribeInstances", when=ADOPT_LOOKUP)

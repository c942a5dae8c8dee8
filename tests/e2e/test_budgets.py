"""A workspace budget enforced end to end on moto (tests/support/ec2boot.py
boots each machine; the real runner, the real beat): a run whose spend
reaches the budget is stopped as at a spot notice (the job is told in its
interrupt file, writes its checkpoint, the runner syncs it before it
reports), its attempt ends ``budget_exceeded``, its machine is retired, and
the overshoot stays within one billing minute of the running set; after the
budget is raised, the same job resumes from that checkpoint.

A stand-in, named: the machine's price is set to $36/h once it runs (the
catalog's price of the 1-CPU machine moto can boot is about a cent an hour,
and a budget is counted in cents: $36/h is a cent a second). The budget is
set and raised by an admin through the budgets' API, as a person would."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import User, commit_all, connect_aws, run_name_of
from tests.e2e.test_aws import _instances, _wait
from tests.e2e.test_aws_spot import _all_terminated, _disconnect_aws, _job
from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

BUCKET = "ty-e2e-budgets"
PRICE = Decimal(36)  # $/h: a cent a second
MINUTE = PRICE * 60 / 3600  # one billing minute of the running set (one machine)
WORKFLOW = """
  - name: budget-train
    provider: bash
    backends: [aws]
    spot_policy: on-demand
    idle_duration: 20s
    checkpoint: ./ckpt
    resources:
      cpu: 1
      memory: 256MB
    commands:
      - mkdir -p ckpt
      - 'step=$(cat ckpt/step 2>/dev/null || echo 0)'
      - 'if [ "$step" != 0 ]; then echo "resuming from step $step"; fi'
      - 'if [ "$TRAINYARD_ATTEMPT" -gt 1 ]; then echo "finished at step $((step + 5))"; exit 0; fi'
      - 'stop() { . "$TRAINYARD_INTERRUPT_FILE"; echo "$step" > ckpt/step; echo "told: $TRAINYARD_INTERRUPT_ACTION at $TRAINYARD_INTERRUPT_AT, checkpoint at step $step"; exit 0; }'
      - trap stop TERM
      - 'while true; do step=$((step + 1)); sleep 0.2 || true; done'
"""


@pytest.fixture
def mira(stack: Stack, aws: MotoServer) -> Iterator[User]:
    user = User("mira", stack.issue_token("mira"), stack)
    yield user
    _shell(
        stack,
        f"from backend.billing.models import Budget; Budget.objects.filter(workspace__slug={user.workspace!r}).delete()",
    )
    _disconnect_aws(user, aws)


def _shell(stack: Stack, code: str) -> Any:
    """Run ``code`` in ``manage.py shell``; what it printed after ``OUT `` (JSON), None if nothing."""
    lines = stack.manage("shell", "-c", code).splitlines()
    found = [line.removeprefix("OUT ") for line in lines if line.startswith("OUT ")]
    return json.loads(found[-1]) if found else None


def _spend(stack: Stack, workspace: str) -> tuple[Decimal, Decimal]:
    """The workspace's spend this month and its running machines' rate, as the budget reads them."""
    found = _shell(
        stack,
        "import json\n"
        "from backend.accounts.models import Workspace\n"
        "from backend.billing.selectors import month_spend\n"
        f"ws = Workspace.objects.get(slug={workspace!r})\n"
        "s = month_spend(workspace_ids=[ws.pk]).get((ws.pk, None))\n"
        "print('OUT ' + json.dumps([str(s.spent), str(s.rate)] if s else ['0', '0']))\n",
    )
    return Decimal(found[0]), Decimal(found[1])


def _set_budget(user: User, limit: Decimal) -> dict[str, Any]:
    """An admin sets the workspace budget (``PUT …/budgets/workspace/``); a raise resumes what it stopped."""
    answer = user.api(
        "PUT", f"/api/v1/workspaces/{user.workspace}/budgets/workspace/", json={"monthly_limit": str(limit)}
    )
    assert answer.status_code == 200, answer.text
    row: dict[str, Any] = answer.json()
    return row


@pytest.mark.timeout(900)  # two machines boot one after the other (the first is retired at the stop)
def test_a_run_is_stopped_at_its_workspace_budget_with_its_checkpoint_and_resumes_from_it_once_raised(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, mira: User, repo: Path
) -> None:
    connect_aws(mira, repo, aws, bucket=BUCKET)
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text().rstrip("\n") + "\n" + WORKFLOW)
    commit_all(repo, "a job that counts steps and checkpoints when told to stop")
    name = run_name_of(mira.cli(repo, "run", "budget-train", "-d"))
    running = _wait(
        "attempt 1's commands to run",
        lambda: (j := _job(mira, name))["status_reason"] == "the commands are running" and j,
        300,
    )
    [machine] = [i for i in _instances(mira) if i["name"] == running["instance"]]
    _shell(
        stack,
        "from backend.clouds.models import Instance\n"
        f"Instance.objects.filter(name={machine['name']!r}).update(price_per_hour='{PRICE}')\n",
    )

    # A budget 20 s of this machine above what the workspace has spent.
    spent, rate = _spend(stack, mira.workspace)
    assert rate == PRICE, (spent, rate)
    limit = (spent + PRICE * 20 / 3600).quantize(Decimal("0.01"), rounding=ROUND_CEILING)
    _set_budget(mira, limit)

    stopped = mira.wait(name, lambda r: r["status"] in ("stopped", "failed", "succeeded"), timeout=120)
    assert stopped["status"] == "stopped", stopped
    assert stopped["status_reason"].startswith(f"stopped by the budget: workspace budget ${limit} reached ($"), stopped
    job = _job(mira, name)
    assert [(a["number"], a["reason"]) for a in job["attempts"]] == [(1, "budget_exceeded")]
    # The job was told as at a notice (action "stop") and wrote its checkpoint; the runner synced it.
    logs = mira.cli(repo, "logs", name).stdout
    told = re.search(r"told: stop at \S+, checkpoint at step (\d+)", logs)
    assert told, logs
    latest = (job.get("checkpoint") or {}).get("latest")
    assert latest is not None and latest["attempt"] == 1, job.get("checkpoint")

    # The machine is retired, not kept idle; what was spent passes the
    # budget by at most one billing minute of the running set.
    _all_terminated(mira, aws)
    final, rate = _spend(stack, mira.workspace)
    assert rate == 0
    assert final <= limit + MINUTE, (final, limit)

    # Raised: the same run and job resume, attempt 2 from that checkpoint.
    _set_budget(mira, limit + 100)
    done = mira.wait(name, lambda r: r["status"] in ("stopped", "failed", "succeeded"), timeout=300)
    assert done["status"] == "succeeded", done
    job = _job(mira, name)
    attempts = job["attempts"]
    assert [(a["number"], a["reason"]) for a in attempts] == [(1, "budget_exceeded"), (2, "done")]
    assert attempts[1]["restored_checkpoint"] == latest["number"]
    logs = mira.cli(repo, "logs", name).stdout
    assert f"resuming from step {told.group(1)}" in logs, logs
    assert f"finished at step {int(told.group(1)) + 5}" in logs, logs
    assert len(mira.runs()) == 1
    _all_terminated(mira, aws)

    # A budget with no room left: the next submission is refused with the numbers, and nothing is written.
    spent, _ = _spend(stack, mira.workspace)
    _set_budget(mira, spent.quantize(Decimal("0.01"), rounding=ROUND_FLOOR))
    refused = mira.cli(repo, "run", "budget-train", "-d")
    assert refused.returncode != 0
    assert re.search(r"workspace budget: \$[\d.]+ this month, \$[\d.]+ spent", refused.stderr), refused.stderr
    assert len(mira.runs()) == 1
    removed = mira.cli(repo, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr

"""What a two-attempt spot run cost, end to end: moto's server over HTTP
plays EC2, tests/support/ec2boot.py boots each machine and serves the spot
notice. Attempt 1 is interrupted, attempt 2 finishes on a second machine,
which then idles until it is retired. Checked from the API's rows, to the
cent: each attempt costs its machine's price x the seconds it held it, the
run the sum of its attempts, each machine its price x its billed seconds
(at least 60), and what no attempt held is the workspace's idle line."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from tests.e2e.conftest import User, commit_all, connect_aws
from tests.e2e.test_aws import _instances, _wait
from tests.e2e.test_aws_spot import _all_terminated, _disconnect_aws, _job
from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

BUCKET = "ty-e2e-aws-spot-cost"
IDLE_SECONDS = 20
WORKFLOW = f"""
  - name: spot-cost
    provider: bash
    backends: [aws]
    spot_policy: spot
    idle_duration: {IDLE_SECONDS}s
    resources:
      cpu: 1
      memory: 256MB
    commands:
      - 'trap "exit 0" TERM'
      - 'if [ "$TRAINYARD_ATTEMPT" = 1 ]; then while true; do sleep 0.2 || true; done; fi'
      - 'echo "finished on attempt $TRAINYARD_ATTEMPT"'
"""
CENT = Decimal("0.01")


@pytest.fixture
def hugo(stack: Stack, aws: MotoServer) -> Iterator[User]:
    user = User("hugo", stack.issue_token("hugo"), stack)
    yield user
    _disconnect_aws(user, aws)


def cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_two_attempt_spot_runs_cost_is_the_sum_of_its_attempts_each_price_times_billed_seconds(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, hugo: User, repo: Path
) -> None:
    connect_aws(hugo, repo, aws, bucket=BUCKET)
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text().rstrip("\n") + "\n" + WORKFLOW)
    commit_all(repo, "a job interrupted on attempt 1")
    submitted = hugo.cli(repo, "run", "spot-cost", "-d")
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    name = submitted.stdout.strip().splitlines()[-1]
    running = _wait(
        "attempt 1's commands to run",
        lambda: (j := _job(hugo, name))["status_reason"] == "the commands are running" and j,
        300,
    )
    [first] = [i for i in _instances(hugo) if i["name"] == running["instance"]]
    time.sleep(2)  # the runner's first polls of the metadata
    ec2_boot.notice(first["backend_id"], "terminate", time.time() + 25)
    done = hugo.wait(name, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=360)
    assert done["status"] == "succeeded", done
    _all_terminated(hugo, aws)

    run = hugo.run(name)
    [job] = run["jobs"]
    machines = {i["name"]: i for i in _instances(hugo)}
    attempts = job["attempts"]
    assert [(a["number"], a["reason"]) for a in attempts] == [(1, "interrupted"), (2, "done")]
    for a in attempts:
        machine = machines[a["instance"]]
        price = Decimal(str(machine["price_per_hour"]))
        assert Decimal(a["price_per_hour"]) == price > 0
        assert (machine["market"], machine["spot"]) == ("spot", True) and machine["price_source"]
        held = (min(at(a["finished_at"]), at(machine["terminated_at"])) - at(a["started_at"])).total_seconds()
        assert abs(a["billed_seconds"] - held) <= 1, (a, machine)
        assert cents(Decimal(a["cost"])) == cents(price * a["billed_seconds"] / 3600)
    assert Decimal(job["cost"]) == Decimal(run["cost"]) == sum(Decimal(a["cost"]) for a in attempts)

    # Each machine: its price x billed seconds, from its first hello to its termination, at least 60.
    used = [machines[a["instance"]] for a in attempts]
    for machine in used:
        span = (at(machine["terminated_at"]) - at(machine["running_at"])).total_seconds()
        assert machine["billed_seconds"] == max(60, math.ceil(span)), machine
        expected = Decimal(str(machine["price_per_hour"])) * machine["billed_seconds"] / 3600
        assert cents(Decimal(machine["cost"])) == cents(expected)

    # The workspace: the run's cost plus what no attempt held (the second
    # machine's idle time before it was retired) is what its machines cost.
    report = hugo.api(
        "GET", f"/api/v1/workspaces/{hugo.workspace}/costs/", params={"since": "1d", "by": "workflow"}
    ).json()
    total = sum((Decimal(m["cost"]) for m in machines.values()), Decimal(0))
    assert Decimal(report["total"]) == total
    assert Decimal(report["idle"]) == total - Decimal(run["cost"]) > 0
    assert report["rows"] == [{"key": "spot-cost", "cost": run["cost"]}]
    removed = hugo.cli(repo, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr

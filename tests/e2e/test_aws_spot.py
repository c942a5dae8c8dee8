"""A spot interruption notice end to end: moto's server over HTTP plays EC2,
tests/support/ec2boot.py boots each instance from its user data and serves
its instance metadata, where the test puts the notice.

The job runs on a spot machine; the notice (T ~25 s ahead) makes the runner
report ``interrupted`` at once; the server ends attempt 1 ``interrupted``,
launches a second machine outside the first one's zone, and the job
finishes there on attempt 2. The first machine is terminated from T on;
after the idle time the second one too: nothing of ours is left running."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import User, commit_all, connect_aws
from tests.e2e.test_aws import _instances, _wait
from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

BUCKET = "ty-e2e-aws-spot"
IDLE_SECONDS = 20
WORKFLOW = f"""
  - name: spot-loop
    provider: bash
    backends: [aws]
    spot_policy: spot
    idle_duration: {IDLE_SECONDS}s
    resources:
      cpu: 1
      memory: 256MB
    commands:
      - 'trap "exit 0" TERM'
      - 'echo "attempt $TRAINYARD_ATTEMPT starts"'
      - 'if [ "$TRAINYARD_ATTEMPT" = 1 ]; then while true; do sleep 0.2 || true; done; fi'
      - 'echo "finished on attempt $TRAINYARD_ATTEMPT"'
"""


@pytest.fixture
def dave(stack: Stack, aws: MotoServer) -> Iterator[User]:
    user = User("dave", stack.issue_token("dave"), stack)
    yield user
    _disconnect_aws(user, aws)


def _all_terminated(user: User, aws: MotoServer) -> None:
    """Every machine of ours gone from moto: retired after ``IDLE_SECONDS`` idle, or stopped."""
    _wait(
        "every machine to be terminated",
        lambda: not aws.our_instances(),
        IDLE_SECONDS + 120,
        explain=lambda: [
            {
                k: i.get(k)
                for k in ("name", "status", "status_reason", "current_job", "cloud_state", "last_heartbeat_at")
            }
            for i in _instances(user)
        ],
    )


def _disconnect_aws(user: User, aws: MotoServer) -> None:
    """What a test that failed half-way left: its runs are stopped, its
    machines terminated and the backend removed, so the next test of the file
    connects ``aws`` afresh instead of failing on "already exists"."""
    backends = user.api("GET", f"/api/v1/workspaces/{user.workspace}/backends/").json()
    if not any(b["name"] == "aws" for b in backends):
        return
    for run in user.runs():
        if run["status"] not in ("succeeded", "failed", "stopped"):
            user.api("POST", f"/api/v1/workspaces/{user.workspace}/runs/{run['name']}/stop/")
    _all_terminated(user, aws)
    _wait(
        "the aws backend to be removed",
        lambda: user.api("DELETE", f"/api/v1/workspaces/{user.workspace}/backends/aws/").status_code == 204,
        60,
    )


def _job(user: User, run: str) -> dict[str, Any]:
    job: dict[str, Any] = user.run(run)["jobs"][0]
    return job


def test_a_spot_notice_moves_the_job_to_a_second_machine_in_another_zone(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, dave: User, repo: Path
) -> None:
    connect_aws(dave, repo, aws, bucket=BUCKET)
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text().rstrip("\n") + "\n" + WORKFLOW)
    commit_all(repo, "a job that runs until it is interrupted on attempt 1")

    submitted = dave.cli(repo, "run", "spot-loop", "-d")
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    name = submitted.stdout.strip().splitlines()[-1]

    running = _wait(
        "attempt 1's commands to run",
        lambda: (j := _job(dave, name))["status_reason"] == "the commands are running" and j,
        300,
    )
    [first] = [i for i in _instances(dave) if i["name"] == running["instance"]]
    time.sleep(2)  # the runner's first polls of the metadata
    deadline = time.time() + 25
    ec2_boot.notice(first["backend_id"], "terminate", deadline)
    noticed = time.time()

    interrupted = _wait(
        "attempt 1 to end interrupted",
        lambda: [a for a in _job(dave, name)["attempts"] if a["number"] == 1 and a["reason"] == "interrupted"],
        30,
    )
    ended_at = time.time()
    assert ended_at - noticed < 15, "the runner reports the interruption within seconds"
    assert "spot interruption notice" in interrupted[0]["message"]

    done = dave.wait(name, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=360)
    assert done["status"] == "succeeded", done
    job = done["jobs"][0]
    assert [(a["number"], a["reason"]) for a in job["attempts"]] == [(1, "interrupted"), (2, "done")]
    machines = {i["name"]: i for i in _instances(dave)}
    second = machines[job["attempts"][1]["instance"]]
    assert second["name"] != first["name"] and second["backend_id"] != first["backend_id"]
    assert second["zone"] != first["zone"], "the interrupted zone is skipped"
    logs = dave.cli(repo, "logs", name)
    assert "finished on attempt 2" in logs.stdout, logs.stdout + logs.stderr

    # The first machine: terminating from the report on, terminated from T on (not before).
    _wait("the first machine to be terminated in moto", lambda: first["backend_id"] in ec2_boot.ended, 90)
    assert time.time() >= deadline - 1
    _all_terminated(dave, aws)
    removed = dave.cli(repo, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr


LOSS_PATTERN = """\
    metrics:
      - name: loss
        regex: 'step (?P<step>[0-9]+)/[0-9]+ loss (?P<value>[0-9.]+)'
"""


def _assert_one_loss_curve(user: User, run: str, *, resumed_at: int) -> None:
    """Attempt 1's values from step 1 to its checkpoint (or the few steps it
    ran past it before it stopped), then attempt 2's from ``resumed_at + 1``
    to 60: one curve over every step, the boundary where attempt 2 starts."""
    answer = user.api(
        "GET",
        f"/api/v1/workspaces/{user.workspace}/runs/{run}/metrics/series/",
        params={"job": "finetune-model", "names": "loss"},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    (series,) = body["series"]
    assert series["x"] == "step"
    steps: dict[int, list[int]] = {1: [], 2: []}
    for step, attempt in zip(series["points"]["x"], series["points"]["attempt"], strict=True):
        steps[attempt].append(step)
    assert steps[1] == list(range(1, len(steps[1]) + 1)) and len(steps[1]) >= resumed_at, steps
    assert steps[2] == list(range(resumed_at + 1, 61)), steps
    assert [(a["number"], a["termination_reason"]) for a in body["attempts"]] == [(1, "interrupted"), (2, "done")]


def _log_lines(user: User, repo: Path, name: str) -> list[str]:
    shown = user.cli(repo, "logs", name)
    return [line.removeprefix("[finetune-model] ") for line in shown.stdout.splitlines()]


def test_tiny_train_noticed_at_step_10_finishes_all_60_steps_on_a_second_machine(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, dave: User, repo: Path
) -> None:
    """finetune-model (60 steps of 0.5 s) on spot; the notice comes at step
    ~10, long before any periodic sync (every 5 minutes): the sync made at
    the notice is the one attempt 2 restores. train.py prints "resuming from
    step k" once with k >= 10, the next step is k + 1, and final.json holds
    all 60 steps and resumed >= 1. Its ``loss``, read off the log, is one
    curve over steps 1..60 that crosses from attempt 1 to attempt 2 once."""
    connect_aws(dave, repo, aws, bucket=BUCKET)
    workflows = repo / ".trainyard" / "workflows.yaml"
    text = workflows.read_text()
    for anchor in ("      - ./base_model\n", "    checkpoint: ./checkpoint\n"):  # both jobs' machines go soon after
        text = text.replace(anchor, f"{anchor}    idle_duration: {IDLE_SECONDS}s\n")
    text = text.replace("    checkpoint: ./checkpoint\n", f"    checkpoint: ./checkpoint\n{LOSS_PATTERN}", 1)
    workflows.write_text(text)
    commit_all(repo, "tiny-train's machines stop soon after their jobs")
    submitted = dave.cli(
        repo,
        *("run", "finetune-model", "-d", "--backend", "aws", "--spot-policy", "spot"),
        *("-e", "STEPS=60", "-e", "STEP_SECONDS=0.5"),
    )
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    name = submitted.stdout.strip().splitlines()[-1]

    _wait(
        "step 10 of finetune-model",
        lambda: any(ln.startswith("step 10/60 ") for ln in _log_lines(dave, repo, name)),
        300,
    )
    job = next(j for j in dave.run(name)["jobs"] if j["workflow"] == "finetune-model")
    [first] = [i for i in _instances(dave) if i["name"] == job["instance"]]
    ec2_boot.notice(first["backend_id"], "terminate", time.time() + 25)

    done = dave.wait(name, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=300)
    assert done["status"] == "succeeded", done
    job = next(j for j in done["jobs"] if j["workflow"] == "finetune-model")
    attempts = job["attempts"]
    assert [a["reason"] for a in attempts] == ["interrupted", "done"], attempts
    assert attempts[0]["instance"] == first["name"] and attempts[1]["instance"] != first["name"]
    restored = attempts[1]["restored_checkpoint"]
    assert restored is not None and restored == job["checkpoint"]["latest"]["number"] - 1, job["checkpoint"]

    logs = _log_lines(dave, repo, name)
    resuming = [line for line in logs if line.startswith("resuming from step ")]
    assert len(resuming) == 1, logs
    k = int(resuming[0].split()[-1])
    assert k >= 10, "the sync made at the notice is restored, not nothing"
    assert logs[logs.index(resuming[0]) + 1].startswith(f"step {k + 1}/60 "), logs
    assert any(f"resumed from checkpoint {restored}" in line for line in logs if line.startswith("--- attempt 2"))
    out = repo.parent / "out"
    downloaded = dave.cli(repo, "artifacts", "download", name, "-o", str(out))
    assert downloaded.returncode == 0, downloaded.stderr
    final = json.loads(next(out.rglob("final.json")).read_text())
    assert final["steps"] == 60 and final["resumed"] >= 1
    _assert_one_loss_curve(dave, name, resumed_at=k)

    _wait("the first machine to be terminated in moto", lambda: first["backend_id"] in ec2_boot.ended, 90)
    _all_terminated(dave, aws)
    removed = dave.cli(repo, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr


AUTO = f"""
  - name: auto-market
    provider: bash
    backends: [aws]
    spot_policy: auto
    max_wait: 20s
    idle_duration: {IDLE_SECONDS}s
    resources:
      cpu: 1
      memory: 256MB
    commands:
      - 'echo "ran on attempt $TRAINYARD_ATTEMPT"'
"""


def test_no_spot_capacity_with_spot_policy_auto_falls_back_to_on_demand_after_max_wait(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, dave: User, repo: Path
) -> None:
    """Every spot RunInstances is refused with InsufficientInstanceCapacity
    (moto over HTTP); the job tries spot offers until max_wait (20 s), then
    runs on an on-demand machine, and `trainyard show` says why."""
    connect_aws(dave, repo, aws, bucket=BUCKET)
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text().rstrip("\n") + "\n" + AUTO)
    commit_all(repo, "a job that takes spot or, failing that, on-demand")
    aws.fault(
        "RunInstances",
        "InsufficientInstanceCapacity",
        message="We currently do not have sufficient spot capacity in the Availability Zone you requested.",
        times=10_000,
        when={"InstanceMarketOptions.MarketType": "spot"},
    )
    submitted = dave.cli(repo, "run", "auto-market", "-d")
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    name = submitted.stdout.strip().splitlines()[-1]
    started = time.monotonic()

    done = dave.wait(name, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=300)
    assert done["status"] == "succeeded", done
    assert time.monotonic() - started >= 20, "spot was tried for max_wait first"
    assert aws.fault_hits("RunInstances", "InsufficientInstanceCapacity") >= 1
    job = done["jobs"][0]
    assert job["attempts"][-1]["spot"] is False and job["attempts"][-1]["backend"] == "aws"
    assert job["placement_note"].startswith("switched to on-demand: no spot machine after waiting"), job
    shown = dave.cli(repo, "show", name)
    assert "switched to on-demand: no spot machine after waiting" in shown.stdout, shown.stdout
    machines = [i for i in _instances(dave) if not i["spot"]]
    assert machines, _instances(dave)

    _all_terminated(dave, aws)
    removed = dave.cli(repo, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr


def test_a_rebalance_recommendation_syncs_a_checkpoint_at_once_and_the_job_stays(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, dave: User, repo: Path
) -> None:
    """A rebalance recommendation (the instance metadata's
    events/recommendations/rebalance, read every second here) on tiny-train's
    machine: a checkpoint version appears within seconds (the periodic sync
    is 5 minutes away), and the job finishes on the same machine, attempt 1."""
    ec2_boot.extra_env["TRAINYARD_RUNNER_REBALANCE_POLL_SECONDS"] = "1"
    connect_aws(dave, repo, aws, bucket=BUCKET)
    workflows = repo / ".trainyard" / "workflows.yaml"
    text = workflows.read_text()
    for anchor in ("      - ./base_model\n", "    checkpoint: ./checkpoint\n"):
        text = text.replace(anchor, f"{anchor}    idle_duration: {IDLE_SECONDS}s\n")
    workflows.write_text(text)
    commit_all(repo, "tiny-train's machines stop soon after their jobs")
    submitted = dave.cli(
        repo,
        *("run", "finetune-model", "-d", "--backend", "aws", "--spot-policy", "spot"),
        *("-e", "STEPS=40", "-e", "STEP_SECONDS=0.5"),
    )
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    name = submitted.stdout.strip().splitlines()[-1]
    _wait(
        "step 5 of finetune-model", lambda: any(ln.startswith("step 5/40 ") for ln in _log_lines(dave, repo, name)), 300
    )
    job = next(j for j in dave.run(name)["jobs"] if j["workflow"] == "finetune-model")
    assert (job["checkpoint"] or {}).get("latest") is None, "no periodic sync yet"
    [machine] = [i for i in _instances(dave) if i["name"] == job["instance"]]

    ec2_boot.rebalance(machine["backend_id"])
    recommended = time.monotonic()
    latest = _wait(
        "a checkpoint version after the recommendation",
        lambda: (next(j for j in dave.run(name)["jobs"] if j["workflow"] == "finetune-model")["checkpoint"] or {}).get(
            "latest"
        ),
        20,
    )
    assert time.monotonic() - recommended < 15
    assert latest["attempt"] == 1

    done = dave.wait(name, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=180)
    assert done["status"] == "succeeded", done
    job = next(j for j in done["jobs"] if j["workflow"] == "finetune-model")
    assert [(a["number"], a["reason"], a["instance"]) for a in job["attempts"]] == [(1, "done", machine["name"])]
    assert not any(line.startswith("resuming from step") for line in _log_lines(dave, repo, name))

    _all_terminated(dave, aws)
    removed = dave.cli(repo, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr

"""tiny-train's finetune-model in the user's own AWS account, end to end:
moto's server over HTTP plays EC2 and S3, tests/support/ec2boot.py plays the
boot of each instance (its user data, unmodified, in a scratch folder).

The workspace connects the account through the CLI (keys; the checks run
for real against moto), the run's jobs go to the cheapest spot offer of the
shipped catalog, the instance boots, installs the runner from the server and
says hello with its single-use token, the logs stream back, the artifacts
land in the workspace's bucket and download byte for byte, a second run
within the idle time reuses the machine, and after the idle time the machine
is terminated: nothing of ours is left running (the ``aws`` fixture)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.e2e.conftest import User, commit_all, connect_aws
from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack
from tests.support.waiting import wait_for as _wait

pytestmark = pytest.mark.slow

BUCKET = "ty-e2e-aws"
IDLE_SECONDS = 25
PLACEMENT = f"    backends: [aws]\n    spot_policy: spot\n    idle_duration: {IDLE_SECONDS}s\n"


def _on_aws(repo: Path) -> None:
    """Both jobs of finetune-model (and its dependency) on AWS spot machines."""
    workflows = repo / ".trainyard" / "workflows.yaml"
    text = workflows.read_text()
    for name in ("download-base-model", "finetune-model"):
        head = f"  - name: {name}\n    provider: bash\n"
        assert head in text
        text = text.replace(head, head + PLACEMENT)
    workflows.write_text(text)
    commit_all(repo, "run on AWS spot")


def _instances(user: User) -> list[dict[str, Any]]:
    answer = user.api("GET", f"/api/v1/workspaces/{user.workspace}/instances/?all=1")
    assert answer.status_code == 200, answer.text
    return [i for i in answer.json() if i["backend"] == "aws"]


def _bucket_objects() -> dict[str, bytes]:
    s3 = boto3.client("s3", region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    return {k: s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


@pytest.fixture
def carol(stack: Stack) -> User:
    """A workspace of its own: its AWS account and bucket touch no other test's runs."""
    return User("carol", stack.issue_token("carol"), stack)


def test_finetune_model_runs_on_a_spot_instance_in_the_users_account_and_nothing_is_left(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, carol: User, repo: Path, tmp_path: Path
) -> None:
    connect_aws(carol, repo, aws, bucket=BUCKET)
    offers = carol.cli(repo, "offers", "--spot", "--region", "us-east-1", "--memory", "256MB")
    assert offers.returncode == 0 and "us-east-1" in offers.stdout, offers.stderr + offers.stdout
    _on_aws(repo)

    first = carol.cli(repo, "run", "finetune-model", timeout=420)

    assert first.returncode == 0, first.stderr + first.stdout
    run = carol.runs()[0]
    assert run["status"] == "succeeded"
    machines = _instances(carol)
    assert len(machines) == 1, machines
    machine = machines[0]
    assert machine["spot"] is True and machine["region"] == "us-east-1" and machine["instance_type"]
    assert machine["backend_id"].startswith("i-")
    ours = aws.our_instances(states=("running",))
    assert [i["InstanceId"] for i in ours] == [machine["backend_id"]]
    assert ours[0].get("InstanceLifecycle") == "spot"
    assert machine["backend_id"] in ec2_boot.booted, "the machine booted from its user data"
    assert {j["instance"] for j in carol.run(run["name"])["jobs"]} == {machine["name"]}

    # The logs streamed back from the machine.
    logs = carol.cli(repo, "logs", run["name"])
    assert logs.returncode == 0 and "step 20/20" in logs.stdout, logs.stderr + logs.stdout

    # The artifacts are in the workspace's bucket and download byte for byte.
    stored = {key.rsplit("/", 1)[-1]: data for key, data in _bucket_objects().items()}
    assert {"weights.json", "state.json"} <= set(stored), sorted(stored)
    out = tmp_path / "downloaded"
    downloaded = carol.cli(repo, "artifacts", "download", run["name"], "-o", str(out))
    assert downloaded.returncode == 0, downloaded.stderr
    got = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert got["state.json"] == stored["state.json"]

    # A second run within the idle time takes the same machine: no new launch.
    second = carol.cli(repo, "run", "finetune-model", "--no-cache", timeout=240)
    assert second.returncode == 0, second.stderr + second.stdout
    again = carol.runs()[0]
    assert again["name"] != run["name"] and again["status"] == "succeeded"
    assert [i["backend_id"] for i in _instances(carol)] == [machine["backend_id"]]
    assert len(aws.our_instances()) == 1
    assert {j["instance"] for j in carol.run(again["name"])["jobs"]} == {machine["name"]}

    # After the idle time the machine is terminated, in our rows and in the cloud.
    _wait("the idle machine to be terminated in moto", lambda: not aws.our_instances(), IDLE_SECONDS + 90)
    ended = _wait(
        "the instance row to end",
        lambda: [i for i in _instances(carol) if i["status"] == "terminated"],
        30,
    )
    assert ended[0]["backend_id"] == machine["backend_id"]
    removed = carol.cli(repo, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr

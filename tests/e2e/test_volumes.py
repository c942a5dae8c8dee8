"""Persistent volumes, end to end (docs/DATA.md, "Volumes").

On AWS (moto's server over HTTP; tests/support/ec2boot.py boots each
instance's runner and plays each EBS volume as a sparse file behind a loop
device): a volume is created in a zone, a job is placed in that zone, makes
a filesystem on it and writes a file, the next run reads it; a second job
that wants it while the first runs waits, saying which job of which run has
it; deleting it while a job uses it is refused; then it is deleted, and no
machine, volume or loop device of the test is left.

On the local backend: a directory volume written by one run is read by the next.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.e2e.conftest import User, commit_all, connect_aws, run_name_of
from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack
from tests.support.waiting import wait_for as _wait

pytestmark = pytest.mark.slow

BUCKET = "ty-e2e-volumes"
ZONE = "us-east-1b"
IDLE = "idle_duration: 20s"


def _workflows(repo: Path, text: str) -> None:
    path = repo / ".trainyard" / "workflows.yaml"
    path.write_text(path.read_text() + "\n" + text)
    commit_all(repo, "volumes")


def _volumes(user: User) -> dict[str, dict[str, Any]]:
    answer = user.api("GET", f"/api/v1/workspaces/{user.workspace}/volumes/")
    assert answer.status_code == 200, answer.text
    return {v["name"]: v for v in answer.json()}


def _our_volumes() -> list[dict[str, Any]]:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    found = ec2.describe_volumes(Filters=[{"Name": "tag-key", "Values": ["trainyard:volume"]}])["Volumes"]
    return [v for v in found if v["State"] not in ("deleting", "deleted")]


@pytest.fixture
def quinn(stack: Stack) -> User:
    """A workspace of its own: its AWS account touches no other test's runs."""
    return User("quinn", stack.issue_token("quinn"), stack)


@pytest.fixture
def yuki(stack: Stack) -> User:
    return User("yuki", stack.issue_token("yuki"), stack)


def test_an_ebs_volume_is_written_by_one_run_read_by_the_next_held_by_one_job_and_deleted(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, quinn: User, repo: Path
) -> None:
    connect_aws(quinn, repo, aws, bucket=BUCKET)
    made = quinn.cli(
        repo, "volume", "create", "ckpt", "--size", "1GB", "--backend", "aws", "--region", "us-east-1", "--zone", ZONE
    )
    assert made.returncode == 0, made.stderr + made.stdout
    [ebs] = _our_volumes()
    assert ebs["AvailabilityZone"] == ZONE and ebs["Size"] == 1
    assert _volumes(quinn)["ckpt"]["backend_id"] == ebs["VolumeId"]
    _workflows(
        repo,
        f"""  - name: write-volume
    provider: bash
    backends: [aws]
    {IDLE}
    volumes:
      - ckpt:./ckpt
    commands:
      - echo "written by $TRAINYARD_RUN_NAME" > ckpt/note.txt
      - df -P ckpt/ | tail -1

  - name: read-volume
    provider: bash
    backends: [aws]
    {IDLE}
    volumes: [ckpt:./ckpt]
    commands:
      - cat ckpt/note.txt

  - name: hold-volume
    provider: bash
    backends: [aws]
    {IDLE}
    volumes: [ckpt:./ckpt]
    commands:
      - touch ckpt/holding
      - for i in $(seq 600); do [ -e ckpt/release ] && break; sleep 0.2; done
      - rm -f ckpt/release ckpt/holding
""",
    )

    first = quinn.cli(repo, "run", "write-volume", timeout=300)
    assert first.returncode == 0, first.stderr + first.stdout
    writer = quinn.runs()[0]
    assert writer["status"] == "succeeded", writer
    [machine] = aws.our_instances()
    assert machine["Placement"]["AvailabilityZone"] == ZONE, "the job was placed in its volume's zone"
    assert ec2_boot.volumes.attached == [(ebs["VolumeId"], machine["InstanceId"])]
    assert "/dev/loop" in quinn.cli(repo, "logs", writer["name"]).stdout, "the job's ./ckpt was the EBS device"

    second = quinn.cli(repo, "run", "read-volume", timeout=300)
    assert second.returncode == 0, second.stderr + second.stdout
    logs = quinn.cli(repo, "logs", quinn.runs()[0]["name"])
    assert f"written by {writer['name']}" in logs.stdout, logs.stdout + logs.stderr

    # One job at a time: the holder runs, the next waits and says who has it.
    holding = run_name_of(quinn.cli(repo, "run", "hold-volume", "-d"))
    quinn.wait(holding, lambda r: r["jobs"][0]["status"] == "running", timeout=120)
    waiting = run_name_of(quinn.cli(repo, "run", "read-volume", "-d"))
    reason = f"waiting for volume ckpt (attached to job hold-volume of run {holding})"
    quinn.wait(waiting, lambda r: r["jobs"][0]["status_reason"] == reason, timeout=60)
    listed = quinn.cli(repo, "volume", "ls")
    assert holding in listed.stdout and "attached" in listed.stdout, listed.stdout

    refused = quinn.cli(repo, "volume", "delete", "ckpt")
    assert refused.returncode != 0
    assert f"in use by job hold-volume of run {holding}" in refused.stderr, refused.stderr
    assert _our_volumes(), "the refused delete left the volume"

    holder_home = ec2_boot.home(aws.our_instances()[0]["InstanceId"])
    marker = next(holder_home.rglob(f"volumes/{ebs['VolumeId']}/holding"))
    (marker.parent / "release").touch()
    quinn.wait(holding, lambda r: r["status"] == "succeeded", timeout=120)
    done = quinn.wait(waiting, lambda r: r["status"] in ("succeeded", "failed"), timeout=180)
    assert done["status"] == "succeeded", done

    # Deleted once no job uses it; then nothing of the test is left.
    _wait("the volume to be detached", lambda: _volumes(quinn)["ckpt"]["attached_to"] is None, 60)
    deleted = quinn.cli(repo, "volume", "delete", "ckpt")
    assert deleted.returncode == 0, deleted.stderr
    assert "ckpt" not in _volumes(quinn)
    assert not _our_volumes()
    _wait("the idle machines to be terminated", lambda: not aws.our_instances(), 120)
    _wait("the loop devices to be freed", lambda: not ec2_boot.volumes.loops, 30)
    assert not ec2_boot.volumes.volume_faults, ec2_boot.volumes.volume_faults
    removed = quinn.cli(repo, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr


def test_a_local_directory_volume_is_written_by_one_run_and_read_by_the_next(yuki: User, repo: Path) -> None:
    made = yuki.cli(repo, "volume", "create", "scratch", "--size", "1GB", "--backend", "local")
    assert made.returncode == 0, made.stderr + made.stdout
    _workflows(
        repo,
        """  - name: write-scratch
    provider: bash
    volumes: [scratch:./scratch]
    commands:
      - echo "kept by $TRAINYARD_RUN_NAME" > scratch/kept.txt

  - name: read-scratch
    provider: bash
    volumes:
      - name: scratch
        path: ./scratch
        read_only: true
    commands:
      - cat scratch/kept.txt
""",
    )
    first = yuki.cli(repo, "run", "write-scratch", timeout=180)
    assert first.returncode == 0, first.stderr + first.stdout
    writer = yuki.runs()[0]["name"]
    second = yuki.cli(repo, "run", "read-scratch", timeout=180)
    assert second.returncode == 0, second.stderr + second.stdout
    logs = yuki.cli(repo, "logs", yuki.runs()[0]["name"])
    assert f"kept by {writer}" in logs.stdout, logs.stdout + logs.stderr
    listed = yuki.cli(repo, "volume", "ls")
    assert "scratch" in listed.stdout and "local" in listed.stdout, listed.stdout
    deleted = yuki.cli(repo, "volume", "delete", "scratch")
    assert deleted.returncode == 0, deleted.stderr
    assert "scratch" not in yuki.cli(repo, "volume", "ls").stdout

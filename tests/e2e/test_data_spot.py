"""Spot interruptions of jobs that read data inputs or hold a volume, end to
end (docs/DATA.md): moto's server over HTTP plays EC2 and S3,
tests/support/ec2boot.py boots each instance, serves the spot notice and
plays each EBS volume as a loop device.

- A job reads a versioned bucket's 20 objects as an input; attempt 1 prints
  their digest and loops; an object is overwritten (a new version); the spot
  notice moves the job to a second machine, which downloads the 20 files
  (its cache had none) at the versions the run listed: the same digest.
- A job writes to its volume on attempt 1 and is interrupted; the volume is
  detached from the first machine, the job keeps it, goes back to the
  volume's zone (the only place it can run) and reads what attempt 1 wrote.

Both end with nothing of ours left: no machine, no volume, no loop device.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.e2e.conftest import User, commit_all, connect_aws, run_name_of
from tests.e2e.test_aws import _instances
from tests.e2e.test_aws_spot import _all_terminated, _disconnect_aws
from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

BUCKET = "ty-e2e-data-spot"
DATA_BUCKET = "ty-e2e-data-spot-set"
ZONE = "us-east-1b"
IDLE_SECONDS = 20
DONE = ("succeeded", "failed", "stopped")
HEAD = f"""
    provider: bash
    backends: [aws]
    spot_policy: spot
    idle_duration: {IDLE_SECONDS}s
    resources:
      cpu: 1
      memory: 256MB
"""
DIGEST = "(cd data && find . -type f | sort | xargs sha256sum) | sha256sum | cut -c1-64"
INPUT_WORKFLOW = f"""
  - name: spot-data{HEAD}    inputs:
      - uri: s3://{DATA_BUCKET}/set/
        path: ./data
    commands:
      - 'trap "exit 0" TERM'
      - 'echo "attempt $TRAINYARD_ATTEMPT digest $({DIGEST}) of $(find data -type f | wc -l) files"'
      - 'if [ "$TRAINYARD_ATTEMPT" = 1 ]; then while true; do sleep 0.2 || true; done; fi'
"""
VOLUME_WORKFLOW = f"""
  - name: spot-volume{HEAD}    volumes: [keep:./keep]
    commands:
      - 'trap "exit 0" TERM'
      - 'if [ "$TRAINYARD_ATTEMPT" = 1 ]; then echo "kept by attempt 1" > keep/note.txt && sync && echo wrote; fi'
      - 'if [ "$TRAINYARD_ATTEMPT" = 1 ]; then while true; do sleep 0.2 || true; done; fi'
      - 'echo "attempt $TRAINYARD_ATTEMPT reads: $(cat keep/note.txt)"'
"""


@pytest.fixture
def gwen(stack: Stack, aws: MotoServer) -> Iterator[User]:
    user = User("gwen", stack.issue_token("gwen"), stack)
    yield user
    for volume in _volumes(user):
        user.api("DELETE", f"/api/v1/workspaces/{user.workspace}/volumes/{volume['name']}/")
    _disconnect_aws(user, aws)


def _volumes(user: User) -> list[dict[str, Any]]:
    answer = user.api("GET", f"/api/v1/workspaces/{user.workspace}/volumes/")
    assert answer.status_code == 200, answer.text
    listed: list[dict[str, Any]] = answer.json()
    return listed


def _our_volumes() -> list[dict[str, Any]]:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    found = ec2.describe_volumes(Filters=[{"Name": "tag-key", "Values": ["trainyard:volume"]}])["Volumes"]
    return [v for v in found if v["State"] not in ("deleting", "deleted")]


def _zone_of(instance_id: str) -> str:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    [reservation] = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    zone: str = reservation["Instances"][0]["Placement"]["AvailabilityZone"]
    return zone


def _add_workflow(repo: Path, text: str) -> None:
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text().rstrip("\n") + "\n" + text)
    commit_all(repo, "a spot job")


def _job(user: User, run: str) -> dict[str, Any]:
    job: dict[str, Any] = user.run(run)["jobs"][0]
    return job


def _running_machine(user: User, run: str) -> dict[str, Any]:
    """Attempt 1's machine, once its commands run."""
    running = wait_for(
        "attempt 1's commands to run",
        lambda: (j := _job(user, run))["status_reason"] == "the commands are running" and j,
        300,
    )
    [machine] = [i for i in _instances(user) if i["name"] == running["instance"]]
    return machine


def _interrupt(user: User, run: str, ec2_boot: Ec2Boot, machine: dict[str, Any]) -> None:
    time.sleep(2)  # the runner's first polls of the metadata
    ec2_boot.notice(machine["backend_id"], "terminate", time.time() + 25)
    wait_for(
        "attempt 1 to end interrupted",
        lambda: [a for a in _job(user, run)["attempts"] if a["number"] == 1 and a["reason"] == "interrupted"],
        30,
    )


def _cached_files(home: Path) -> list[Path]:
    """The files of a machine's data cache (``<work dir>/data/<id[:2]>/<id>``)."""
    return [p for p in home.rglob("*") if p.is_file() and p.parent.parent.name == "data" and len(p.name) == 64]


def _log(user: User, repo: Path, run: str) -> str:
    shown = user.cli(repo, "logs", run)
    return shown.stdout + shown.stderr


def test_a_spot_interrupted_attempt_reads_the_listed_versions_on_a_new_machine(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, gwen: User, repo: Path
) -> None:
    connect_aws(gwen, repo, aws, bucket=BUCKET)
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=DATA_BUCKET)
    s3.put_bucket_versioning(Bucket=DATA_BUCKET, VersioningConfiguration={"Status": "Enabled"})
    files = {f"{i:02d}.bin": hashlib.sha256(str(i).encode()).digest() * (1 + i) for i in range(20)}
    for key, body in files.items():
        s3.put_object(Bucket=DATA_BUCKET, Key=f"set/{key}", Body=body)
    sums = "".join(f"{hashlib.sha256(files[k]).hexdigest()}  ./{k}\n" for k in sorted(files))
    digest = hashlib.sha256(sums.encode()).hexdigest()
    _add_workflow(repo, INPUT_WORKFLOW)

    name = run_name_of(gwen.cli(repo, "run", "spot-data", "-d", timeout=300))
    first = _running_machine(gwen, name)
    assert f"attempt 1 digest {digest} of 20 files" in _log(gwen, repo, name)
    s3.put_object(Bucket=DATA_BUCKET, Key="set/07.bin", Body=b"a new version")
    _interrupt(gwen, name, ec2_boot, first)

    done = gwen.wait(name, lambda r: r["status"] in DONE, timeout=360)
    assert done["status"] == "succeeded", done
    attempts = done["jobs"][0]["attempts"]
    assert [(a["number"], a["reason"]) for a in attempts] == [(1, "interrupted"), (2, "done")]
    second = {i["name"]: i for i in _instances(gwen)}[attempts[1]["instance"]]
    assert second["backend_id"] != first["backend_id"]
    assert f"attempt 2 digest {digest} of 20 files" in _log(gwen, repo, name), "the listed versions, not the new one"
    cached = _cached_files(ec2_boot.home(second["backend_id"]))
    assert sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in cached) == sorted(
        hashlib.sha256(b).hexdigest() for b in files.values()
    ), "the new machine downloaded the 20 listed files itself"

    wait_for("the first machine to be terminated in moto", lambda: first["backend_id"] in ec2_boot.ended, 90)
    _all_terminated(gwen, aws)
    for version in s3.list_object_versions(Bucket=DATA_BUCKET).get("Versions", []):
        s3.delete_object(Bucket=DATA_BUCKET, Key=version["Key"], VersionId=version["VersionId"])
    s3.delete_bucket(Bucket=DATA_BUCKET)
    removed = gwen.cli(repo, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr


def test_a_volume_job_interrupted_on_spot_goes_back_to_the_volume_zone_and_reads_what_it_wrote(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, gwen: User, repo: Path
) -> None:
    connect_aws(gwen, repo, aws, bucket=BUCKET)
    made = gwen.cli(
        repo, "volume", "create", "keep", "--size", "1GB", "--backend", "aws", "--region", "us-east-1", "--zone", ZONE
    )
    assert made.returncode == 0, made.stderr + made.stdout
    [ebs] = _our_volumes()
    _add_workflow(repo, VOLUME_WORKFLOW)

    name = run_name_of(gwen.cli(repo, "run", "spot-volume", "-d", timeout=300))
    first = _running_machine(gwen, name)
    wait_for("attempt 1 to write the note", lambda: "wrote" in _log(gwen, repo, name), 30)
    assert _zone_of(first["backend_id"]) == ZONE
    _interrupt(gwen, name, ec2_boot, first)

    reasons: set[str] = set()

    def over() -> bool:
        run = gwen.run(name)
        reasons.add(run["jobs"][0]["status_reason"])
        return run["status"] in DONE

    wait_for("the job to finish on attempt 2", over, 300)
    done = gwen.run(name)
    assert done["status"] == "succeeded", (done, reasons)
    job = done["jobs"][0]
    assert [(a["number"], a["reason"]) for a in job["attempts"]] == [(1, "interrupted"), (2, "done")]
    second = {i["name"]: i for i in _instances(gwen)}[job["attempts"][1]["instance"]]
    assert second["backend_id"] != first["backend_id"]
    assert _zone_of(second["backend_id"]) == ZONE, (
        "the volume's zone, where it was interrupted: the only place it can run"
    )
    assert any(f"back in zone {ZONE}" in r and "volume keep is there" in r for r in reasons), reasons
    assert "attempt 2 reads: kept by attempt 1" in _log(gwen, repo, name)
    assert ec2_boot.volumes.attached == [
        (ebs["VolumeId"], first["backend_id"]),
        (ebs["VolumeId"], second["backend_id"]),
    ], "detached from the first machine, attached to the second"
    assert not ec2_boot.volumes.volume_faults, ec2_boot.volumes.volume_faults

    wait_for("the volume to be let go", lambda: _volumes(gwen)[0]["attached_to"] is None, 60)
    deleted = gwen.cli(repo, "volume", "delete", "keep")
    assert deleted.returncode == 0, deleted.stderr
    assert not _volumes(gwen) and not _our_volumes()
    _all_terminated(gwen, aws)
    wait_for("the loop devices to be freed", lambda: not ec2_boot.volumes.loops, 30)
    removed = gwen.cli(repo, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr

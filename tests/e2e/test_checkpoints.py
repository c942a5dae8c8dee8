"""Versioned checkpoints, end to end: real runners sync a job's
``checkpoint:`` path while it runs (every second here), each sync a new
version that becomes the latest only once verified; a runner SIGKILLed
mid-run is replaced, and attempt 2 restores the latest version before its
commands start. LocalStorage (the embedded default) for tiny-train's
resume, the workspace's S3 bucket (moto over HTTP) for the changed-files
and half-uploaded-version cases. Every run is pinned to the local backend
(``--backend local``): killing its runner is losing the machine."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import boto3
import pytest

from backend.artifacts.s3 import composite_checksum
from tests.e2e.conftest import User, commit_all, connect_aws, run_name_of
from tests.e2e.test_aws import _instances, _wait
from tests.e2e.test_s3_storage import BUCKET, _connect_bucket
from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack

KEEP = 3
MiB = 1 << 20
STEPPED = """
  - name: stepped
    provider: bash
    checkpoint: ./ckpt
    commands:
      - if [ -e ckpt/step ]; then echo "restored step $(cat ckpt/step) big $(sha256sum ckpt/big.bin | cut -c1-16)"; exit 0; fi
      - mkdir -p ckpt && head -c 11534339 /dev/urandom > ckpt/big.bin && echo 1 > ckpt/step
      - until [ -e "$CONTROL/2" ]; do sleep 0.1; done; echo 2 > ckpt/step
      - until [ -e "$CONTROL/3" ]; do sleep 0.1; done; echo 3 > ckpt/step
      - until [ -e "$CONTROL/end" ]; do sleep 0.1; done
"""


@pytest.fixture(scope="module")
def ckpt_stack(stack: Stack, moto_server: MotoServer) -> Iterator[Stack]:
    """The session's stack with checkpoints synced every second, KEEP kept,
    parts of 5 MiB above 6 MiB, and moto's endpoint and keys."""
    extra = {
        **moto_server.env,
        "TRAINYARD_CHECKPOINT_SYNC_SECONDS": "1",
        "TRAINYARD_CHECKPOINT_KEEP": str(KEEP),
        # big.bin (11 MiB) goes up to S3 in parts, and is carried as such.
        "TRAINYARD_MULTIPART_THRESHOLD": str(6 * MiB),
        "TRAINYARD_MULTIPART_PART_SIZE": str(5 * MiB),
    }
    saved = {k: stack.env.get(k) for k in extra}
    stack.env.update(extra)
    for name in ("web", "worker"):
        stack.restart(name)
    try:
        yield stack
    finally:
        for key, value in saved.items():
            if value is None:
                stack.env.pop(key, None)
            else:
                stack.env[key] = value
        for name in ("web", "worker"):
            stack.restart(name)


@pytest.fixture(scope="module")
def cora(ckpt_stack: Stack) -> User:
    """A user of her own: no AWS connection left behind by other tests, so
    her workspace stores in the local storage until a test connects a bucket."""
    return User("cora", ckpt_stack.issue_token("cora"), ckpt_stack)


def _job(cora: User, name: str, workflow: str) -> dict[str, Any]:
    return next(j for j in cora.run(name)["jobs"] if j["workflow"] == workflow)


def _wait_latest(cora: User, name: str, workflow: str, until: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        latest = (_job(cora, name, workflow).get("checkpoint") or {}).get("latest")
        if latest is not None and until(latest):
            return latest
        assert time.monotonic() < deadline, f"checkpoint of {workflow} never reached the state; latest {latest}"
        time.sleep(0.2)


def _versions(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    """Every checkpoint version row of the job: number, status, and its files' keys."""
    code = f"""
import json
from backend.artifacts.models import Artifact
out = []
for a in Artifact.stored.filter(job_id={job_id!r}, kind="checkpoint").order_by("number"):
    out.append({{"number": a.number, "attempt": a.attempt, "status": a.status, "prefix": a.storage_prefix,
                "files": {{f.path: f.key for f in a.files.all()}}}})
print(json.dumps(out))
"""
    return list(json.loads(stack.manage("shell", "-c", code).strip().splitlines()[-1]))


def _kill_runner_of(stack: Stack, marker: str) -> None:
    """SIGKILL the runner of the job whose processes have ``marker`` in their
    environment: the local backend gives every job process the runner's
    directory (``TRAINYARD_RUNNER_DIR``), whose pid file names the runner."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() not in environ:
            continue
        runner_dir = next((e.split(b"=", 1)[1] for e in environ if e.startswith(b"TRAINYARD_RUNNER_DIR=")), b"")
        pidfile = Path(runner_dir.decode() + ".pid")
        if runner_dir and pidfile.exists():
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
            return
    raise AssertionError(
        f"no job process with {marker} (did the job end already?); runners: {stack.runner_processes()}"
    )


def test_tiny_train_killed_mid_run_resumes_from_its_latest_checkpoint(
    ckpt_stack: Stack, cora: User, repo: Path
) -> None:
    """finetune-model, 40 steps of 0.2 s on LocalStorage: its runner is
    SIGKILLed once a few versions exist; attempt 2 (another runner) restores
    the latest before train.py starts, which prints "resuming from step k"
    once, k > 0, and ends with all 40 steps and resumed >= 1. Old versions
    are pruned to KEEP."""
    name = run_name_of(
        cora.cli(repo, "run", "finetune-model", "-d", "--backend", "local", "-e", "STEPS=40", "-e", "STEP_SECONDS=0.2")
    )
    latest = _wait_latest(cora, name, "finetune-model", lambda v: v["number"] >= 2, timeout=90)
    # state.json, and state.tmp too when a sync copied it just before train.py's rename.
    assert latest["attempt"] == 1 and latest["files"] in (1, 2) and latest["size"] > 0

    _kill_runner_of(ckpt_stack, f"TRAINYARD_JOB_ID={_job(cora, name, 'finetune-model')['id']}")
    run = cora.wait(name, lambda r: r["status"] in ("succeeded", "failed"), timeout=120)

    assert run["status"] == "succeeded", run
    job = _job(cora, name, "finetune-model")
    attempts = job["attempts"]
    assert [a["reason"] for a in attempts] == ["instance_lost", "done"]
    restored = attempts[1]["restored_checkpoint"]
    assert restored is not None and restored >= latest["number"]
    logs = [line.removeprefix("[finetune-model] ") for line in cora.cli(repo, "logs", name).stdout.splitlines()]
    resuming = [line for line in logs if line.startswith("resuming from step ")]
    assert len(resuming) == 1, logs
    k = int(resuming[0].split()[-1])
    assert 0 < k < 40
    # The loss sequence continues from the checkpointed step: attempt 2 starts at k + 1.
    after = logs[logs.index(resuming[0]) + 1]
    assert after.startswith(f"step {k + 1}/40 "), after
    assert any(f"resumed from checkpoint {restored}" in line for line in logs if line.startswith("--- attempt 2"))
    out = repo.parent / "out"
    assert cora.cli(repo, "artifacts", "download", name, "-o", str(out)).returncode == 0
    final = json.loads(next(out.rglob("final.json")).read_text())
    assert final["steps"] == 40 and final["resumed"] >= 1
    # Pruned: at most KEEP versions, the latest among them, and only their objects on disk.
    versions = _versions(ckpt_stack, job["id"])
    assert len([v for v in versions if v["status"] == "complete"]) == KEEP
    assert job["checkpoint"]["latest"]["number"] == max(v["number"] for v in versions)
    # This job's objects only: the session's storage holds other tests' checkpoints too.
    storage = ckpt_stack.data_dir / "storage"
    on_disk = {p.parent.name for p in storage.rglob(f"jobs/{job['id']}/checkpoints/*/*/state.json")}
    assert on_disk, f"no checkpoint object of job {job['id']} under {storage}"
    # A version whose state.json had not changed since the one before (the
    # sync at exit, right after a periodic one) names that one's object as
    # its file's key; a file of its own has no key (its prefix/path).
    kept = {PurePosixPath(v["files"]["state.json"] or f"{v['prefix']}/state.json").parent.name for v in versions}
    assert on_disk == kept


def test_only_changed_files_go_up_and_a_half_uploaded_version_never_replaces_the_latest(
    ckpt_stack: Stack, aws: MotoServer, cora: User, repo: Path, tmp_path: Path
) -> None:
    """In the workspace's bucket: version 2 uploads only the changed file
    (the unchanged one, uploaded in parts, is carried by reference and
    verified by its composite checksum); with S3 refusing every
    presigned PUT, version 3 never becomes the latest, and the attempt
    after the runner is killed restores version 2, bytes and all."""
    workspace_id = _connect_bucket(ckpt_stack, cora.workspace)
    try:
        _changed_files_and_half_versions(ckpt_stack, aws, cora, repo, tmp_path, workspace_id)
    finally:  # later tests of the session store in the local storage again
        ckpt_stack.manage(
            "shell",
            "-c",
            f"from backend.clouds.models import CloudAccount; "
            f"CloudAccount.objects.filter(workspace__slug={cora.workspace!r}, kind='aws').delete()",
        )


def _changed_files_and_half_versions(
    ckpt_stack: Stack, aws: MotoServer, cora: User, repo: Path, tmp_path: Path, workspace_id: str
) -> None:
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + STEPPED)
    commit_all(repo, "a stepped checkpoint")
    control = tmp_path / "control"
    control.mkdir()
    s3 = boto3.client("s3", region_name="us-east-1")

    def objects(prefix: str) -> dict[str, bytes]:
        found = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        return {o["Key"][len(prefix) :]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in found}

    name = run_name_of(cora.cli(repo, "run", "stepped", "-d", "--backend", "local", "-e", f"CONTROL={control}"))
    v1 = _wait_latest(cora, name, "stepped", lambda v: v["files"] == 2)
    job_id = _job(cora, name, "stepped")["id"]
    run_id = cora.run(name)["id"]
    prefix = f"trainyard/{workspace_id}/runs/{run_id}/jobs/{job_id}/checkpoints/1/"
    first = objects(f"{prefix}{v1['number']}/")
    assert set(first) == {"big.bin", "step"} and first["step"] == b"1\n"
    head = s3.head_object(Bucket=BUCKET, Key=f"{prefix}{v1['number']}/big.bin", ChecksumMode="ENABLED")
    parts = [hashlib.sha256(first["big.bin"][i : i + 5 * MiB]).hexdigest() for i in range(0, 11534339, 5 * MiB)]
    assert len(parts) == 3 and head["ChecksumSHA256"].split("-")[0] == composite_checksum(parts)  # went up in parts

    (control / "2").touch()
    v2 = _wait_latest(cora, name, "stepped", lambda v: v["number"] > v1["number"])

    assert objects(f"{prefix}{v2['number']}/") == {"step": b"2\n"}  # only the changed file went up
    versions = {v["number"]: v for v in _versions(ckpt_stack, job_id)}
    assert versions[v2["number"]]["files"]["big.bin"] == f"{prefix}{v1['number']}/big.bin"

    # Every presigned PUT refused from now on (as expired; fresh URLs are refused too).
    aws.fault("PresignedRequest", "AccessDenied", times=10_000, when={"method": "PUT"})
    (control / "3").touch()
    deadline = time.monotonic() + 60
    while aws.fault_hits("PresignedRequest", "AccessDenied") < 8:  # two syncs gave up
        assert time.monotonic() < deadline, "the refused syncs never happened"
        time.sleep(0.2)
    job = _job(cora, name, "stepped")
    assert job["checkpoint"]["latest"]["number"] == v2["number"]
    half = [v for v in _versions(ckpt_stack, job_id) if v["number"] > v2["number"]]
    assert half and all(v["status"] == "uploading" for v in half)

    _kill_runner_of(ckpt_stack, f"CONTROL={control}")
    run = cora.wait(name, lambda r: r["status"] in ("succeeded", "failed"), timeout=120)
    aws.clear_faults()

    assert run["status"] == "succeeded", run
    attempts = _job(cora, name, "stepped")["attempts"]
    assert attempts[1]["restored_checkpoint"] == v2["number"]
    big = first["big.bin"]
    expected = f"restored step 2 big {hashlib.sha256(big).hexdigest()[:16]}"
    assert expected in cora.cli(repo, "logs", name).stdout.splitlines()


RESTORE_FAILS = """
  - name: lost-checkpoint
    provider: bash
    checkpoint: ./ckpt
    retry: {limit: 2}
    commands:
      - mkdir -p ckpt && echo 1 > ckpt/step
      - until [ -e "$CONTROL/never" ]; do sleep 0.1; done
"""


def test_a_checkpoint_that_cannot_be_restored_ends_the_attempt_interrupted_not_failed(
    ckpt_stack: Stack, cora: User, repo: Path, tmp_path: Path
) -> None:
    """The latest version's object vanished from the storage: attempt 2's
    restore fails before its commands start, and the attempt ends
    ``interrupted`` (retried like an interruption) with the reason, not
    ``error``."""
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + RESTORE_FAILS)
    commit_all(repo, "a checkpoint that will be lost")
    control = tmp_path / "control"
    control.mkdir()
    name = run_name_of(cora.cli(repo, "run", "lost-checkpoint", "-d", "--backend", "local", "-e", f"CONTROL={control}"))
    latest = _wait_latest(cora, name, "lost-checkpoint", lambda v: v["files"] == 1)
    job_id = _job(cora, name, "lost-checkpoint")["id"]
    [version] = [v for v in _versions(ckpt_stack, job_id) if v["number"] == latest["number"]]
    stored = ckpt_stack.data_dir / "storage" / version["prefix"] / "step"
    assert stored.read_bytes() == b"1\n"
    stored.unlink()

    _kill_runner_of(ckpt_stack, f"CONTROL={control}")
    run = cora.wait(name, lambda r: r["status"] in ("succeeded", "failed"), timeout=120)

    attempts = _job(cora, name, "lost-checkpoint")["attempts"]
    assert [a["reason"] for a in attempts] == ["instance_lost", "interrupted"], attempts
    assert attempts[1]["restored_checkpoint"] == latest["number"]
    assert f"could not restore checkpoint {latest['number']}" in attempts[1]["message"]
    assert run["status"] == "failed" and "2 of 2 attempts" in run["jobs"][0]["status_reason"], run


def test_a_machine_terminated_behind_the_runners_back_is_replaced_within_45s_from_the_last_periodic_sync(
    ckpt_stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, cora: User, repo: Path
) -> None:
    """finetune-model on an EC2 machine (moto, the boot helper), synced every
    second. The machine vanishes — every process on it SIGKILLed, then
    terminated in moto, no notice — once a few versions exist: within 45 s
    the attempt ends (heartbeat lost, the cloud says gone), and attempt 2, on
    a new machine, restores the last periodic sync and finishes the run."""
    cora.cli(repo, "backend", "rm", "aws")  # the bucket-only account of the tests above
    connect_aws(cora, repo, aws, bucket="ty-e2e-vanish")
    workflows = repo / ".trainyard" / "workflows.yaml"
    text = workflows.read_text()
    for anchor in ("      - ./base_model\n", "    checkpoint: ./checkpoint\n"):
        text = text.replace(anchor, f"{anchor}    idle_duration: 15s\n")
    workflows.write_text(text)
    commit_all(repo, "tiny-train's machines stop soon after their jobs")
    name = run_name_of(
        cora.cli(repo, "run", "finetune-model", "-d", "--backend", "aws", "-e", "STEPS=60", "-e", "STEP_SECONDS=0.5")
    )
    latest = _wait_latest(cora, name, "finetune-model", lambda v: v["number"] >= 3, timeout=300)
    job = _job(cora, name, "finetune-model")
    [first] = [i for i in _instances(cora) if i["name"] == job["instance"]]

    ec2_boot.pull_the_plug(first["backend_id"])
    vanished = time.monotonic()
    ended = _wait(
        "attempt 1 to end",
        lambda: [a for a in _job(cora, name, "finetune-model")["attempts"] if a["number"] == 1 and a["reason"]],
        60,
    )
    assert time.monotonic() - vanished < 45, "a machine that vanished is found out within 45 s"
    assert ended[0]["reason"] == "instance_lost", ended
    assert "is gone" in ended[0]["message"], ended

    run = cora.wait(name, lambda r: r["status"] in ("succeeded", "failed"), timeout=300)
    assert run["status"] == "succeeded", run
    attempts = _job(cora, name, "finetune-model")["attempts"]
    assert [a["reason"] for a in attempts] == ["instance_lost", "done"]
    assert attempts[1]["instance"] != first["name"]
    assert attempts[1]["restored_checkpoint"] >= latest["number"]
    logs = [line.removeprefix("[finetune-model] ") for line in cora.cli(repo, "logs", name).stdout.splitlines()]
    resuming = [line for line in logs if line.startswith("resuming from step ")]
    assert len(resuming) == 1 and int(resuming[0].split()[-1]) > 0, logs
    out = repo.parent / "out-vanish"
    assert cora.cli(repo, "artifacts", "download", name, "-o", str(out)).returncode == 0
    final = json.loads(next(out.rglob("final.json")).read_text())
    assert final["steps"] == 60 and final["resumed"] >= 1

    _wait("every machine to be terminated", lambda: not aws.our_instances(), 180)
    assert cora.cli(repo, "backend", "rm", "aws").returncode == 0

"""examples/s3-dataset as written (docs/DATA.md): a dataset in the user's own
bucket as an input, the model copied to another bucket under the run's name.
moto's server over HTTP plays S3 (the workspace's AWS connection reads and
writes both buckets), the local backend's runner downloads the dataset.

What a user checks: the dry run lists the dataset with its size, the job
reads every file, the model lands under ``points/<run name>/``, a second run
with nothing changed is reused from the cache, and one changed object runs
the job again with the reason naming the input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import boto3
import pytest

from tests.e2e.conftest import User, connect_aws, git
from tests.support.moto import MotoServer
from tests.support.stack import Stack
from tests.support.waiting import wait_for as _wait

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "s3-dataset"
DONE = ("succeeded", "failed", "stopped")


@pytest.fixture
def fern(stack: Stack) -> User:
    return User("fern", stack.issue_token("fern"), stack)


def _example_repo(tmp_path: Path) -> Path:
    path = tmp_path / "s3-dataset"
    shutil.copytree(EXAMPLE, path)
    git(path, "init", "-q", "-b", "main")
    git(path, "-c", "user.email=t@example.com", "-c", "user.name=T", "add", "-A")
    git(path, "-c", "user.email=t@example.com", "-c", "user.name=T", "commit", "-qm", "init")
    origin = tmp_path / "s3-dataset-origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(path), str(origin))
    git(path, "remote", "add", "origin", str(origin))
    git(path, "fetch", "-q", "origin")
    return path


def _points(slope: float, n: int) -> bytes:
    rows = "\n".join(f"{x},{slope * x + 1.0}" for x in (i / n for i in range(n)))
    return f"x,y\n{rows}\n".encode()


def _finished(user: User, repo: Path, *args: str) -> tuple[str, str]:
    result = user.cli(repo, "run", "train-on-s3", *args, timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    said = (result.stderr + result.stdout).splitlines()
    name = next(line.split()[1] for line in said if line.startswith("Run ") and " submitted" in line)
    run = user.wait(name, lambda r: r["status"] in DONE, timeout=120)
    assert run["status"] == "succeeded", run
    return name, result.stdout


def _objects(bucket: str, prefix: str) -> dict[str, bytes]:
    s3 = boto3.client("s3", region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def test_the_s3_dataset_example_trains_on_the_bucket_and_copies_the_model_out(
    stack: Stack, aws: MotoServer, fern: User, tmp_path: Path
) -> None:
    repo = _example_repo(tmp_path)
    connect_aws(fern, repo, aws, bucket="ty-e2e-data-artifacts")
    s3 = boto3.client("s3", region_name="us-east-1")
    for bucket in ("acme-data", "acme-models"):
        s3.create_bucket(Bucket=bucket)
    for i in range(3):
        s3.put_object(Bucket="acme-data", Key=f"points/part-{i}.csv", Body=_points(2.0, 50))
    try:
        plan = fern.cli(repo, "run", "train-on-s3", "--dry-run")
        assert plan.returncode == 0, plan.stderr + plan.stdout
        assert "s3://acme-data/points/" in plan.stdout and "3 files" in plan.stdout, plan.stdout

        first, _ = _finished(fern, repo)
        logs = fern.cli(repo, "logs", first).stdout
        assert "150 points from 3 files" in logs, logs
        model = _wait(
            "the model under the run's name",
            lambda: _objects("acme-models", f"points/{first}/").get(f"points/{first}/weights.json"),
            60,
        )
        assert json.loads(model)["a"] > 1.0

        again, _ = _finished(fern, repo)
        assert fern.run(again)["jobs"][0]["cache_decision"]["reused"] is True

        s3.put_object(Bucket="acme-data", Key="points/part-1.csv", Body=_points(3.0, 50))
        changed, _ = _finished(fern, repo)
        decision = fern.run(changed)["jobs"][0]["cache_decision"]
        assert decision["reused"] is False
        assert "input s3://acme-data/points/ changed: 1 changed" in decision["text"], decision
        assert _wait(
            "the changed run's model",
            lambda: _objects("acme-models", f"points/{changed}/").get(f"points/{changed}/weights.json"),
            60,
        )
    finally:
        for bucket in ("acme-data", "acme-models"):
            for key in _objects(bucket, ""):
                s3.delete_object(Bucket=bucket, Key=key)
            s3.delete_bucket(Bucket=bucket)
        fern.cli(repo, "backend", "rm", "aws")

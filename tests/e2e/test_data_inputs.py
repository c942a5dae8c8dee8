"""Data inputs end to end (real stack, real CLI, the local backend's runner,
moto's S3 over HTTP as the workspace's S3-compatible endpoint, its request
log saying what was downloaded).

What a user checks: a prefix of 200 objects lands byte-identical at the
input's path; a second job on the same machine reads it without
downloading anything; an unchanged dataset is a cache hit; one changed
object runs the job again with the reason naming the input and the object,
and only that object is downloaded."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.e2e.conftest import User, commit_all, make_repo, run_name_of
from tests.support.moto import MotoServer
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

BUCKET = "e2e-data"
URI = f"s3://{BUCKET}/set/"
DONE = ("succeeded", "failed", "stopped")
WORKFLOWS = f"""
  - name: sums
    provider: bash
    inputs: [{URI}]
    idle_duration: 10m
    commands:
      - mkdir -p out
      - cd set && find . -type f | sort | xargs sha256sum > ../out/sums && cat ../out/sums
    artifacts: [./out]
  - name: count
    provider: bash
    idle_duration: 10m
    inputs:
      - uri: {URI}
        path: ./data/set
    commands: ['echo "files: $(find data/set -type f | wc -l)"']
"""


@pytest.fixture
def dilys(stack: Stack) -> User:
    return User("dilys", stack.issue_token("dilys"), stack)


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path / "moto-data", log_requests=True)
    (tmp_path / "moto-data").mkdir()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _client(server: MotoServer) -> Any:
    return boto3.client(
        "s3",
        region_name="us-east-1",
        endpoint_url=server.url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _finished(user: User, repo: Path, workflow: str) -> str:
    name = run_name_of(user.cli(repo, "run", workflow, "-d", timeout=300))
    run = user.wait(name, lambda r: r["status"] in DONE, timeout=180)
    assert run["status"] == "succeeded", run
    return name


def _downloads(server: MotoServer) -> list[str]:
    return [r["path"] for r in server.requests("presigned GET")]


def test_a_dataset_lands_whole_is_cached_on_the_machine_and_a_changed_object_reruns_the_job(
    stack: Stack, dilys: User, s3: MotoServer, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "data-repo")
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + WORKFLOWS)
    commit_all(repo, "data workflows")
    client = _client(s3)
    client.create_bucket(Bucket=BUCKET)
    files = {f"train/{i:04d}.bin": os.urandom(1 + (i * 37) % 5000) for i in range(200)}
    for key, body in files.items():
        client.put_object(Bucket=BUCKET, Key=f"set/{key}", Body=body)
    connected = dilys.cli(
        repo, "data", "endpoint", "set", s3.url, "--access-key-id", "testing", "--region", "us-east-1", input="testing"
    )
    assert connected.returncode == 0, connected.stderr
    try:
        plan = dilys.cli(repo, "run", "sums", "--dry-run")
        assert plan.returncode == 0, plan.stderr
        assert f"   data: {URI} → set: 200 files," in plan.stdout, plan.stdout

        first = _finished(dilys, repo, "sums")
        logs = dilys.cli(repo, "logs", first).stdout
        expected = [f"{hashlib.sha256(files[k]).hexdigest()}  ./{k}" for k in sorted(files)]
        assert [line for line in logs.splitlines() if line.endswith(".bin")] == expected
        assert sorted(_downloads(s3)) == sorted(f"/{BUCKET}/set/{k}" for k in files)

        before = len(_downloads(s3))
        counted = _finished(dilys, repo, "count")
        assert "files: 200" in dilys.cli(repo, "logs", counted).stdout
        assert len(_downloads(s3)) == before  # the same machine's cache: nothing downloaded

        again = _finished(dilys, repo, "sums")
        assert dilys.run(again)["jobs"][0]["cache_decision"]["reused"] is True

        client.put_object(Bucket=BUCKET, Key="set/train/0007.bin", Body=b"relabelled")
        changed = _finished(dilys, repo, "sums")
        decision = dilys.run(changed)["jobs"][0]["cache_decision"]
        assert decision["reused"] is False
        assert decision["text"] == f"runs: input {URI} changed: 1 changed (train/0007.bin)", decision
        assert _downloads(s3)[before:] == [f"/{BUCKET}/set/train/0007.bin"]
        assert hashlib.sha256(b"relabelled").hexdigest() in dilys.cli(repo, "logs", changed).stdout
    finally:
        dilys.cli(repo, "data", "endpoint", "rm")

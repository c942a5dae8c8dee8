"""Outputs to a named place (``artifacts: - to: s3://…``), end to end: the
real stack (web, worker, beat), a real runner, moto's server over HTTP. An
artifact lands under the named prefix with the run's name filled in, byte
for byte; a run reused from the cache copies to its own name; a destination
the account may not write is retried and shown failed with the reason, the
stored artifact untouched."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.e2e.conftest import User, commit_all
from tests.support.moto import MotoServer
from tests.support.stack import Stack

STORAGE = "ty-e2e-out-storage"
MODELS = "ty-e2e-out-models"
LOCKED = "ty-e2e-out-locked"
MAKE_MODEL = (
    "mkdir -p model/sub && python -c \"import os; open('model/weights.bin','wb').write(os.urandom(300000))\""
    " && echo '{\"layers\": 2}' > model/sub/config.json"
)


@pytest.fixture(scope="module")
def aws_stack(stack: Stack, moto_server: MotoServer) -> Iterator[Stack]:
    """The session's stack with moto's endpoint, copies retried after 1 s
    (then 4 s), three attempts, and the beat's sweep every second."""
    extra = {
        **moto_server.env,
        "TRAINYARD_EXPORT_RETRY_SECONDS": "1",
        "TRAINYARD_EXPORT_ATTEMPTS": "3",
        "TRAINYARD_EXPORT_SWEEP_SECONDS": "1",
    }
    saved = {k: stack.env.get(k) for k in extra}
    stack.env.update(extra)
    for name in ("web", "worker", "beat"):
        stack.restart(name)
    try:
        yield stack
    finally:
        for key, value in saved.items():
            if value is None:
                stack.env.pop(key, None)
            else:
                stack.env[key] = value
        for name in ("web", "worker", "beat"):
            stack.restart(name)


def _connect(stack: Stack, workspace: str, keys: dict[str, str], *, bucket: str = STORAGE) -> None:
    """The workspace's AWS account (as the connect flow stores it) with ``keys``
    and its storage ``bucket`` ("": the installation's local storage)."""
    config = {"regions": ["us-east-1"], **({"bucket": bucket} if bucket else {})}
    code = f"""
import json
from backend.accounts.models import Workspace
from backend.clouds.models import CloudAccount
from backend.vault.crypto import encrypt
ws = Workspace.objects.get(slug={workspace!r})
CloudAccount.objects.filter(workspace=ws, kind="aws").delete()
CloudAccount.objects.create(workspace=ws, kind="aws", name="aws", config={config!r},
    credentials_ciphertext=encrypt({json.dumps(keys)!r}))
"""
    stack.manage("shell", "-c", code)


@pytest.fixture
def alice_aws(aws_stack: Stack, aws: MotoServer, alice: User) -> Iterator[User]:
    s3 = boto3.client("s3", region_name="us-east-1")
    for bucket in (STORAGE, MODELS, LOCKED):
        s3.create_bucket(Bucket=bucket)
    _connect(aws_stack, alice.workspace, {"access_key_id": "testing", "secret_access_key": "testing"})
    yield alice
    code = f"""
from backend.clouds.models import CloudAccount
CloudAccount.objects.filter(workspace__slug={alice.workspace!r}, kind="aws").delete()
"""
    aws_stack.manage("shell", "-c", code)


def _workflow(repo: Path, to: str) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(
        f"""workflows:
  - name: make-model
    provider: bash
    commands:
      - {json.dumps(MAKE_MODEL)}
    artifacts:
      - path: ./model
        to: {to}
"""
    )
    commit_all(repo, f"a model copied to {to}")


def _exports(user: User, run: str, until: str, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = user.api("GET", f"/api/v1/workspaces/{user.workspace}/runs/{run}/exports/").json()
        if found and all(e["status"] == until for e in found):
            return list(found)
        if time.monotonic() > deadline:
            raise AssertionError(f"the exports of {run} are not all {until} after {timeout}s: {found}")
        time.sleep(0.3)


def _objects(s3: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix) :]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def _nothing_left(user: User, aws: MotoServer, runs: list[str]) -> None:
    """No run of the test still active, no copy pending or copying, no machine of ours."""
    for run in runs:
        assert user.run(run)["status"] in ("succeeded", "failed", "stopped")
        exports = user.api("GET", f"/api/v1/workspaces/{user.workspace}/runs/{run}/exports/").json()
        assert all(e["status"] in ("done", "failed") for e in exports), exports
    assert aws.our_instances() == []


def test_an_artifact_lands_under_its_to_prefix_and_a_reused_run_copies_to_its_own_name(
    alice_aws: User, aws: MotoServer, repo: Path
) -> None:
    alice = alice_aws
    _workflow(repo, f"s3://{MODELS}/models/${{{{ run.name }}}}/")

    first = alice.cli(repo, "run", "make-model", timeout=240)
    assert first.returncode == 0, first.stderr + first.stdout
    run = alice.runs()[0]["name"]

    [export] = _exports(alice, run, "done")
    s3 = boto3.client("s3", region_name="us-east-1")
    landed = _objects(s3, MODELS, f"models/{run}/")
    [artifact] = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/runs/{run}/artifacts/").json()
    manifest = {f["path"]: f["sha256"] for f in artifact["files"]}
    assert {path: hashlib.sha256(body).hexdigest() for path, body in landed.items()} == manifest
    assert set(landed) == {"weights.bin", "sub/config.json"} and len(landed["weights.bin"]) == 300000
    assert export["destination"] == f"s3://{MODELS}/models/{run}/"
    assert (export["objects_copied"], export["method"], export["attempts"]) == (2, "server-side", 1)
    assert artifact["export"]["status"] == "done"
    listed = alice.cli(repo, "artifacts", "list", run)
    assert f"make-model ./model → s3://{MODELS}/models/{run}/ (copied)" in listed.stdout, listed.stdout

    second = alice.cli(repo, "run", "make-model", timeout=240)
    assert second.returncode == 0, second.stderr + second.stdout
    reused = alice.runs()[0]["name"]
    assert alice.run(reused)["jobs"][0]["cached_from"]["run"] == run

    [again] = _exports(alice, reused, "done")
    assert again["destination"] == f"s3://{MODELS}/models/{reused}/"
    assert _objects(s3, MODELS, f"models/{reused}/") == landed
    shown = alice.cli(repo, "show", reused)
    assert f"make-model ./model → s3://{MODELS}/models/{reused}/ (copied)" in shown.stdout, shown.stdout
    _nothing_left(alice, aws, [run, reused])


def test_a_destination_the_account_cannot_write_is_retried_then_shown_failed_and_the_artifact_stays(
    alice_aws: User, aws: MotoServer, aws_stack: Stack, repo: Path, tmp_path: Path
) -> None:
    """The account's keys are an IAM user that may not write the destination.
    Its artifacts stay in the installation's storage (moto's IAM checks do
    not read presigned URLs, so the upload does not go through moto), and
    the copy is streamed and refused."""
    alice = alice_aws
    iam = boto3.client("iam", region_name="us-east-1")
    iam.create_user(UserName="trainyard")
    models_only = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "s3:*", "Resource": [f"arn:aws:s3:::{MODELS}", f"arn:aws:s3:::{MODELS}/*"]},
            # The account's own checks (machines, volumes) pass: it stays active, its keys sign the copy.
            {"Effect": "Allow", "Action": ["ec2:Describe*", "sts:GetCallerIdentity"], "Resource": "*"},
        ],
    }
    iam.put_user_policy(UserName="trainyard", PolicyName="models-only", PolicyDocument=json.dumps(models_only))
    key = iam.create_access_key(UserName="trainyard")["AccessKey"]
    keys = {"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}
    _connect(aws_stack, alice.workspace, keys, bucket="")
    _workflow(repo, f"s3://{LOCKED}/models/${{{{ run.name }}}}/")

    with aws.iam_auth():
        result = alice.cli(repo, "run", "make-model", timeout=240)
        assert result.returncode == 0, result.stderr + result.stdout
        run = alice.runs()[0]["name"]
        [export] = _exports(alice, run, "failed", timeout=90)

    assert export["attempts"] == 3
    assert "AccessDenied" in export["error"], export
    assert _objects(boto3.client("s3", region_name="us-east-1"), LOCKED, "") == {}
    # The stored artifact is complete and downloads as its manifest says.
    [artifact] = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/runs/{run}/artifacts/").json()
    assert artifact["status"] == "complete"
    out = tmp_path / "downloaded"
    downloaded = alice.cli(repo, "artifacts", "download", run, "-o", str(out))
    assert downloaded.returncode == 0, downloaded.stderr
    got = {p.relative_to(out / "model").as_posix(): p.read_bytes() for p in (out / "model").rglob("*") if p.is_file()}
    assert {p: hashlib.sha256(b).hexdigest() for p, b in got.items()} == {
        f["path"]: f["sha256"] for f in artifact["files"]
    }
    listed = alice.cli(repo, "artifacts", "list", run)
    assert f"make-model ./model → s3://{LOCKED}/models/{run}/ (failed: " in listed.stdout, listed.stdout
    assert "AccessDenied" in listed.stdout
    _nothing_left(alice, aws, [run])

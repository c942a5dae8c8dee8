"""A workspace with its own S3 bucket (moto's server over HTTP): the real
stack and real runners put tiny-train's artifacts there through presigned
URLs (a large file in presigned parts), ask for fresh URLs when one expires,
and the CLI and the dashboard's link download them byte for byte."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest

from tests.e2e.conftest import User, commit_all
from tests.support.moto import MotoServer
from tests.support.stack import Stack

BUCKET = "ty-e2e-artifacts"
MiB = 1 << 20
BIG = "import os, pathlib; pathlib.Path('base_model/big.bin').write_bytes(os.urandom(11 * 2**20 + 3))"


@pytest.fixture(scope="module")
def aws_stack(stack: Stack, moto_server: MotoServer) -> Iterator[Stack]:
    """The session's stack, its web and worker restarted with moto's
    endpoint and keys, and parts of 5 MiB above 6 MiB."""
    extra = {
        **moto_server.env,
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


def _connect_bucket(stack: Stack, workspace: str) -> str:
    """The AWS account row as the connect flow stores it (that flow is
    another part's): the bucket in config, moto's keys encrypted."""
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    code = f"""
import json
from backend.accounts.models import Workspace
from backend.clouds.models import CloudAccount
from backend.vault.crypto import encrypt
ws = Workspace.objects.get(slug={workspace!r})
CloudAccount.objects.filter(workspace=ws, kind="aws").delete()
CloudAccount.objects.create(workspace=ws, kind="aws", name="aws", config={{"bucket": {BUCKET!r}, "regions": ["us-east-1"]}},
    credentials_ciphertext=encrypt(json.dumps({{"access_key_id": "testing", "secret_access_key": "testing"}})))
print(ws.pk)
"""
    return stack.manage("shell", "-c", code).strip().splitlines()[-1]


ARCHIVED_LOG = re.compile(r"/jobs/[0-9a-f-]+/log-[0-9a-f]{12}\.txt$")


def _objects() -> dict[str, bytes]:
    s3 = boto3.client("s3", region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    return {k: s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


@pytest.fixture
def alice_bucket(aws_stack: Stack, alice: User) -> Iterator[str]:
    """Alice's workspace with the bucket connected, and without it again
    afterwards (later tests of hers must not store in moto, nor get AWS offers)."""
    yield _connect_bucket(aws_stack, alice.workspace)
    code = f"""
from backend.clouds.models import CloudAccount
CloudAccount.objects.filter(workspace__slug={alice.workspace!r}, kind="aws").delete()
"""
    aws_stack.manage("shell", "-c", code)


def test_tiny_train_artifacts_live_in_the_workspaces_bucket_and_download_byte_identical(
    aws_stack: Stack, aws: MotoServer, alice: User, bob: User, repo: Path, tmp_path: Path, alice_bucket: str
) -> None:
    workspace_id = alice_bucket
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(
        workflows.read_text().replace(
            "      - python download.py\n", f'      - python download.py\n      - python -c "{BIG}"\n'
        )
    )
    commit_all(repo, "a large base model")
    # The first single PUT, the first part and the first GET get a URL that has expired.
    for when in ({"method": "PUT", "part": "no"}, {"method": "PUT", "part": "yes"}, {"method": "GET", "part": "no"}):
        aws.fault("PresignedRequest", "AccessDenied", when=when)

    result = alice.cli(repo, "run", "finetune-model", timeout=240)

    assert result.returncode == 0, result.stderr + result.stdout
    run_name = alice.runs()[0]["name"]
    assert aws.fault_hits("PresignedRequest", "AccessDenied") == 3
    # Fresh URLs were asked for: the part batch plus one part and one whole file again; one input file again.
    web_log = (aws_stack.logs_dir / "web.log").read_text()
    upload_urls = re.findall(r"POST /api/v1/runner/jobs/([0-9a-f-]+)/artifacts/[0-9a-f-]+/urls/", web_log)
    download_urls = re.findall(r"POST /api/v1/runner/jobs/([0-9a-f-]+)/urls/", web_log)
    jobs = {j["workflow"]: j["id"] for j in alice.run(run_name)["jobs"]}
    assert upload_urls.count(jobs["download-base-model"]) == 3
    assert download_urls.count(jobs["finetune-model"]) == 1
    run = alice.runs()[0]
    artifacts = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/runs/{run['name']}/artifacts/").json()
    stored = _objects()
    # Logs of alice's jobs that ended minutes ago, archived into her bucket by the beat
    # (docs/LOGS.md, "Archive"): in her workspace's prefix, beside the artifacts.
    logs = {k for k in stored if ARCHIVED_LOG.search(k)}
    assert all(k.startswith(f"trainyard/{workspace_id}/runs/") for k in logs)
    stored = {k: v for k, v in stored.items() if k not in logs}
    assert stored and all(k.startswith(f"trainyard/{workspace_id}/runs/{run['id']}/jobs/") for k in stored)
    by_name = {k.rsplit("/", 1)[-1]: v for k, v in stored.items()}
    assert len(by_name["big.bin"]) == 11 * MiB + 3
    files = [f for a in artifacts for f in a["files"]]
    assert {f["path"] for f in files} >= {"big.bin", "weights.json", "state.json"}
    assert all(hashlib.sha256(by_name[f["path"].rsplit("/", 1)[-1]]).hexdigest() == f["sha256"] for f in files)

    # The CLI: presigned URLs, without our token (S3 would refuse a request with both).
    out = tmp_path / "downloaded"
    downloaded = alice.cli(repo, "artifacts", "download", run["name"], "-o", str(out))
    assert downloaded.returncode == 0, downloaded.stderr
    got = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {name: got[name] for name in ("big.bin", "weights.json", "state.json")} == {
        name: by_name[name] for name in ("big.bin", "weights.json", "state.json")
    }

    # The dashboard's link: a redirect to S3's origin, a download there.
    checkpoint = next(a for a in artifacts if a["path"] == "./checkpoint")
    link = f"/api/v1/workspaces/{alice.workspace}/artifacts/{checkpoint['id']}/files/state.json"
    redirect = alice.api("GET", link)
    assert redirect.status_code == 302 and redirect.headers["Location"].startswith(f"{aws.url}/{BUCKET}/")
    download = httpx.get(redirect.headers["Location"], timeout=30)
    assert download.content == by_name["state.json"]
    assert download.headers["content-type"] == "application/octet-stream"
    assert download.headers["content-disposition"].startswith('attachment; filename="state.json"')

    # Another workspace gets no URL for it, under its own name or alice's.
    for ws in (bob.workspace, alice.workspace):
        denied = bob.api("GET", link.replace(f"/workspaces/{alice.workspace}/", f"/workspaces/{ws}/"))
        assert denied.status_code in (403, 404) and "location" not in denied.headers

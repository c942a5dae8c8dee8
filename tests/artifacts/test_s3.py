"""A workspace's own S3 bucket (moto's server over HTTP): presigned URLs,
multipart uploads with presigned parts, and completion checked without
reading the bytes back."""

from __future__ import annotations

import base64
import hashlib
import os
import time
import urllib.error
import urllib.request
from email.message import Message
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest

from backend.accounts.models import Workspace
from backend.artifacts.locations import storage_for_new, storage_of
from backend.artifacts.models import Artifact, ArtifactStatus
from backend.artifacts.s3 import S3Storage
from backend.artifacts.services import (
    FileIn,
    artifact_begin,
    artifact_complete,
    artifact_file_key,
    artifact_parts_complete,
    artifact_upload_targets,
    blob_create,
)
from backend.artifacts.storage import LocalStorage, Part, Target
from backend.core.errors import ApplicationError
from backend.runs.models import Run
from tests.support.fixtures import Person
from tests.support.moto import MotoServer, s3_account

MiB = 1 << 20
BUCKET = "ty-artifacts"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _put(target: Target, data: bytes) -> Message:
    headers = {**target.headers, "Content-Type": "application/octet-stream"}
    request = urllib.request.Request(target.url, data=data, method="PUT", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.headers


def _get(url: str) -> tuple[bytes, Message]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read(), response.headers


def _objects() -> list[str]:
    listed = boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket=BUCKET)
    return [o["Key"] for o in listed.get("Contents", [])]


@pytest.fixture
def bucket(aws: MotoServer, team: Workspace) -> Any:
    return s3_account(team, bucket=BUCKET)


def test_a_workspace_with_an_aws_bucket_stores_there_and_one_without_stores_locally(
    bucket: Any, team: Workspace, outsider: Person
) -> None:
    other = outsider.user.memberships.get().workspace

    assert isinstance(storage_for_new(workspace_id=team.pk), S3Storage)
    assert storage_for_new(workspace_id=team.pk).bucket == BUCKET
    assert isinstance(storage_for_new(workspace_id=other.pk), LocalStorage)


def test_a_presigned_put_then_get_round_trips_the_bytes_as_a_download(bucket: Any, team: Workspace) -> None:
    storage = storage_for_new(workspace_id=team.pk)
    data = os.urandom(300_000)
    key = f"trainyard/{team.pk}/t/weights.bin"

    _put(storage.upload_target(key, sha256=_sha(data), size=len(data), seconds=900), data)
    body, headers = _get(storage.signed_url(key, method="GET", filename="weights.bin"))

    assert body == data
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Content-Disposition"].startswith('attachment; filename="weights.bin"')
    assert storage.verify(key, size=len(data), sha256=_sha(data), part_sha256s=[]) == ""


def test_a_presigned_put_is_bound_to_the_files_checksum_and_size(bucket: Any, team: Workspace) -> None:
    target = storage_for_new(workspace_id=team.pk).upload_target("k", sha256=_sha(b"x"), size=1, seconds=900)
    signed = parse_qs(urlsplit(target.url).query)["X-Amz-SignedHeaders"][0].split(";")

    assert "x-amz-checksum-sha256" in signed
    # Issue 11, item 11: bound to its declared size too (S3 checks a signed
    # content-length; moto checks no signature, so the URL is what is tested).
    assert "content-length" in signed
    assert target.headers["x-amz-checksum-sha256"] == base64.b64encode(hashlib.sha256(b"x").digest()).decode()


def test_urls_live_at_most_15_minutes_whatever_is_asked(bucket: Any, team: Workspace) -> None:
    storage = storage_for_new(workspace_id=team.pk)
    get = storage.signed_url("k", method="GET", seconds=6 * 3600)
    put = storage.upload_target("k", sha256=_sha(b""), size=0, seconds=6 * 3600)

    assert parse_qs(urlsplit(get).query)["X-Amz-Expires"] == ["900"]
    assert parse_qs(urlsplit(put.url).query)["X-Amz-Expires"] == ["900"]
    assert put.seconds == 900


def test_an_expired_url_is_refused_with_403(bucket: Any, team: Workspace) -> None:
    storage = storage_for_new(workspace_id=team.pk)
    data = b"expiring"
    _put(storage.upload_target("k", sha256=_sha(data), size=len(data), seconds=900), data)
    url = storage.signed_url("k", method="GET", seconds=1)
    time.sleep(2.1)

    with pytest.raises(urllib.error.HTTPError) as refused:
        _get(url)

    assert refused.value.code == 403


def test_completion_rejects_a_wrong_size_and_a_wrong_checksum_and_accepts_the_right_one(bucket: Any, run: Run) -> None:
    data = os.urandom(4096)
    other = os.urandom(4096)
    artifact, (upload,) = artifact_begin(job=run.jobs.get(), path="./out", files=[FileIn("w.bin", 4096, _sha(data))])
    key = artifact_file_key(artifact, artifact.files.get())
    storage = storage_of(artifact)

    _put(Target(upload.url, upload.headers, 900), data[:100])
    with pytest.raises(ApplicationError, match=r"w\.bin: 100 bytes stored, 4096 expected"):
        artifact_complete(artifact=artifact)
    _put(storage.upload_target(key, sha256=_sha(other), size=len(other), seconds=900), other)  # same size, other bytes
    with pytest.raises(ApplicationError, match="SHA-256 checksum differs"):
        artifact_complete(artifact=artifact)
    _put(Target(upload.url, upload.headers, 900), data)

    assert artifact_complete(artifact=artifact).status == ArtifactStatus.COMPLETE
    assert key.startswith(f"trainyard/{run.workspace_id}/runs/{run.pk}/jobs/")


def test_a_file_above_the_threshold_goes_up_in_presigned_parts(bucket: Any, run: Run, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "MULTIPART_THRESHOLD": 6 * MiB, "MULTIPART_PART_SIZE": 5 * MiB}
    data = os.urandom(11 * MiB + 3)
    small = b"small file"
    files = [FileIn("big.bin", len(data), _sha(data)), FileIn("small.txt", len(small), _sha(small))]
    artifact, uploads = artifact_begin(job=run.jobs.get(), path="./model", files=files)
    big, whole = uploads
    chunks = [data[i : i + big.part_size] for i in range(0, len(data), big.part_size)]

    first = artifact_upload_targets(artifact=artifact, path="big.bin", parts=[(1, _sha(chunks[0]))])
    rest = artifact_upload_targets(
        artifact=artifact, path="big.bin", parts=[(2, _sha(chunks[1])), (3, _sha(chunks[2]))]
    )
    etags = [_put(t, c)["ETag"] for t, c in zip(first + rest, chunks, strict=True)]
    _put(Target(whole.url, whole.headers, 900), small)
    with pytest.raises(ApplicationError, match="its parts were not completed"):
        artifact_complete(artifact=artifact)
    parts = [Part(n, e, _sha(c)) for n, (e, c) in enumerate(zip(etags, chunks, strict=True), start=1)]
    with pytest.raises(ApplicationError, match=r"has 3 parts: name each of 1\.\.3 once"):
        artifact_parts_complete(artifact=artifact, path="big.bin", parts=parts[:2])
    artifact_parts_complete(artifact=artifact, path="big.bin", parts=parts)
    done = artifact_complete(artifact=artifact)
    body, _ = _get(storage_of(done).signed_url(artifact_file_key(done, done.files.get(path="big.bin")), method="GET"))

    assert (big.url, big.part_size, big.parts, whole.part_size) == ("", 5 * MiB, 3, 0)
    assert [len(c) for c in chunks] == [5 * MiB, 5 * MiB, MiB + 3]
    assert done.status == ArtifactStatus.COMPLETE
    assert body == data


def test_parts_claimed_with_other_checksums_fail_the_completion(bucket: Any, run: Run, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "MULTIPART_THRESHOLD": 6 * MiB, "MULTIPART_PART_SIZE": 5 * MiB}
    data = os.urandom(7 * MiB)
    artifact, _ = artifact_begin(job=run.jobs.get(), path="./model", files=[FileIn("big.bin", len(data), _sha(data))])
    chunks = [data[: 5 * MiB], data[5 * MiB :]]
    targets = artifact_upload_targets(artifact=artifact, path="big.bin", parts=[(1, _sha(c)) for c in chunks[:1]])
    targets += artifact_upload_targets(artifact=artifact, path="big.bin", parts=[(2, _sha(chunks[1]))])
    etags = [_put(t, c)["ETag"] for t, c in zip(targets, chunks, strict=True)]
    # The server completes with the checksums it is told; S3 (not moto) would refuse a mismatch
    # there already, and the stored composite checksum no longer matches what was recorded.
    artifact_parts_complete(
        artifact=artifact,
        path="big.bin",
        parts=[Part(1, etags[0], _sha(chunks[0])), Part(2, etags[1], _sha(chunks[1]))],
    )
    artifact.files.update(part_sha256s=[_sha(b"a"), _sha(b"b")])

    with pytest.raises(ApplicationError, match="SHA-256 checksum differs"):
        artifact_complete(artifact=artifact)


def test_objects_stay_readable_where_they_were_stored_after_the_account_changes_bucket(
    bucket: Any, run: Run, viewer: Person
) -> None:
    data = b"weights"
    artifact, (upload,) = artifact_begin(job=run.jobs.get(), path="./out", files=[FileIn("w.bin", 7, _sha(data))])
    _put(Target(upload.url, upload.headers, 900), data)
    artifact_complete(artifact=artifact)
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="ty-new-bucket")
    bucket.config = {**bucket.config, "bucket": "ty-new-bucket"}
    bucket.save()

    redirect = viewer.client().get(f"/api/v1/workspaces/acme/artifacts/{artifact.pk}/files/w.bin")
    body, headers = _get(redirect["Location"])

    assert Artifact.objects.get(pk=artifact.pk).storage_bucket == BUCKET
    assert storage_for_new(workspace_id=run.workspace_id).bucket == "ty-new-bucket"
    assert urlsplit(redirect["Location"]).path == f"/{BUCKET}/{artifact.storage_prefix}/w.bin"
    assert (body, headers["Content-Disposition"][:30]) == (data, 'attachment; filename="w.bin"; ')


def test_an_object_of_a_removed_account_says_so(bucket: Any, run: Run, viewer: Person) -> None:
    data = b"weights"
    artifact, (upload,) = artifact_begin(job=run.jobs.get(), path="./out", files=[FileIn("w.bin", 7, _sha(data))])
    _put(Target(upload.url, upload.headers, 900), data)
    artifact_complete(artifact=artifact)
    bucket.delete()

    answer = viewer.client().get(f"/api/v1/workspaces/acme/artifacts/{artifact.pk}/files/w.bin")

    assert answer.status_code == 410
    assert "ty-artifacts" in answer.json()["message"]


def test_a_code_blob_is_written_into_the_bucket(bucket: Any, team: Workspace, owner: Person) -> None:
    data = os.urandom(200_000)

    blob = blob_create(workspace=team, user=owner.user, chunks=iter([data[:1000], data[1000:]]))
    body, _ = _get(storage_of(blob).signed_url(blob.storage_key, method="GET"))

    assert (blob.size, blob.sha256, blob.storage_bucket) == (len(data), _sha(data), BUCKET)
    assert body == data
    assert _objects() == [f"trainyard/{team.pk}/blobs/{blob.pk}"]


def test_another_workspace_gets_no_url_for_the_artifact(bucket: Any, run: Run, outsider: Person) -> None:
    data = b"weights"
    artifact, (upload,) = artifact_begin(job=run.jobs.get(), path="./out", files=[FileIn("w.bin", 7, _sha(data))])
    _put(Target(upload.url, upload.headers, 900), data)
    artifact_complete(artifact=artifact)
    theirs = outsider.user.memberships.get().workspace.slug

    answers = [
        outsider.client().get(f"/api/v1/workspaces/{theirs}/artifacts/{artifact.pk}/files/w.bin"),
        outsider.client().get(f"/api/v1/workspaces/acme/artifacts/{artifact.pk}/files/w.bin"),
    ]

    assert [a.status_code for a in answers] == [404, 404]
    assert not any(a.get("Location") for a in answers)

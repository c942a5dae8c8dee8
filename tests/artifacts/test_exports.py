"""Copies of artifacts to a workflow's ``to:`` (backend/artifacts/exports.py)
against moto's server over HTTP: what a completed upload starts, what one
attempt copies, and the bookkeeping of retries, failures and dropped workers."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from datetime import timedelta
from typing import Any

import boto3
import pytest
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.artifacts.exports import STALE_CLAIM, export_attempt, exports_due, retry_wait
from backend.artifacts.models import Artifact, ArtifactExport, ExportStatus
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete
from backend.artifacts.storage import get_storage
from backend.clouds.models import BackendKind, CloudAccount
from backend.runs.lifecycle.dag import cache_key
from backend.runs.models import Job
from backend.vault.crypto import encrypt
from tests.support.fixtures import Person, submit
from tests.support.moto import MotoServer, s3_account

STORAGE = "ty-artifacts"
MODELS = "ty-models"
TO = f"s3://{MODELS}/m/${{{{ run.name }}}}/${{{{ job.name }}}}/"
WORKFLOWS = f"""\
workflows:
  - name: train
    provider: bash
    commands: [echo]
    artifacts:
      - path: ./out
        to: {TO}
"""
FILES = {"w.bin": os.urandom(70_000), "sub/c.json": b'{"a": 1}'}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _stored(job: Job) -> Artifact:
    """``./out`` of ``job`` uploaded as a runner does and completed."""
    artifact, uploads = artifact_begin(
        job=job, path="./out", files=[FileIn(p, len(d), _sha(d)) for p, d in FILES.items()]
    )
    for upload in uploads:
        data = FILES[upload.path]
        if not artifact.storage_bucket:
            get_storage().write(f"{artifact.storage_prefix}/{upload.path}", iter([data]))
            continue
        headers = {**upload.headers, "Content-Type": "application/octet-stream"}
        request = urllib.request.Request(upload.url, data=data, method="PUT", headers=headers)
        urllib.request.urlopen(request, timeout=30).close()
    return artifact_complete(artifact=artifact)


def _landed(prefix: str) -> dict[str, bytes]:
    s3 = boto3.client("s3", region_name="us-east-1")
    listed = s3.list_objects_v2(Bucket=MODELS, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix) :]: s3.get_object(Bucket=MODELS, Key=o["Key"])["Body"].read() for o in listed}


@pytest.fixture
def job(aws: MotoServer, team: Workspace, owner: Person) -> Job:
    s3_account(team, bucket=STORAGE)
    return submit(team, owner.user, "train", WORKFLOWS).jobs.get()


def test_the_job_keeps_its_exports_as_written_and_they_leave_its_cache_key_alone(job: Job) -> None:
    assert job.spec["exports"] == {"./out": TO}
    without = {k: v for k, v in job.spec.items() if k != "exports"}
    assert cache_key(spec=job.spec, code="c", inputs=[]) == cache_key(spec=without, code="c", inputs=[])


def test_a_completed_upload_begins_its_export_and_one_attempt_copies_it_server_side(
    job: Job, django_capture_on_commit_callbacks: Any
) -> None:
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=MODELS)
    with django_capture_on_commit_callbacks(execute=False) as sent:
        artifact = _stored(job)
    export = ArtifactExport.objects.get(job=job)
    assert (export.status, export.artifact_id, export.attempts) == (ExportStatus.PENDING, artifact.pk, 0)
    assert export.destination == f"s3://{MODELS}/m/{job.run.name}/train/"
    assert len(sent) == 1

    assert export_attempt(export_id=export.pk) == "copied 2 object(s) server-side"

    export.refresh_from_db()
    assert (export.status, export.attempts, export.objects_copied, export.bytes_copied) == (
        ExportStatus.DONE,
        1,
        2,
        sum(len(d) for d in FILES.values()),
    )
    assert _landed(f"m/{job.run.name}/train/") == FILES
    assert export_attempt(export_id=export.pk) == "not due"  # a duplicate message copies nothing again


def test_an_artifact_in_local_storage_is_streamed_to_the_destination(
    aws: MotoServer, team: Workspace, owner: Person
) -> None:
    keys = {"access_key_id": "testing", "secret_access_key": "testing"}
    CloudAccount.objects.create(
        workspace=team,
        kind=BackendKind.AWS,
        name="aws",
        config={"regions": ["us-east-1"]},
        credentials_ciphertext=encrypt(json.dumps(keys)),
    )
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=MODELS)
    job = submit(team, owner.user, "train", WORKFLOWS).jobs.get()
    _stored(job)

    assert export_attempt(export_id=ArtifactExport.objects.get(job=job).pk) == "copied 2 object(s) streamed"
    assert _landed(f"m/{job.run.name}/train/") == FILES


def test_a_failed_attempt_waits_longer_each_time_and_the_last_one_fails_with_the_reason(
    job: Job, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "EXPORT_ATTEMPTS": 3, "EXPORT_RETRY_SECONDS": 30.0}
    artifact = _stored(job)  # the destination bucket does not exist
    export = ArtifactExport.objects.get(job=job)
    waits = []
    for attempt in (1, 2, 3):
        before = timezone.now()
        outcome = export_attempt(export_id=export.pk)
        export.refresh_from_db()
        assert export.attempts == attempt
        assert "NoSuchBucket" in export.error and "NoSuchBucket" in outcome
        if export.status == ExportStatus.PENDING:
            waits.append(round((export.next_attempt_at - before).total_seconds()))
            assert export_attempt(export_id=export.pk) == "not due"
            ArtifactExport.objects.filter(pk=export.pk).update(next_attempt_at=timezone.now())

    assert waits == [30, 120]
    assert (export.status, export.next_attempt_at) == (ExportStatus.FAILED, None)
    assert export_attempt(export_id=export.pk) == "not due"
    # The stored artifact is as it was.
    stored = Artifact.objects.get(pk=artifact.pk)
    assert (stored.status, stored.total_size, stored.completed_at) == (
        artifact.status,
        artifact.total_size,
        artifact.completed_at,
    )


def test_the_sweep_takes_back_a_copy_whose_worker_died_and_sends_what_is_due(job: Job) -> None:
    _stored(job)
    export = ArtifactExport.objects.get(job=job)
    long_ago = timezone.now() - STALE_CLAIM - timedelta(seconds=1)
    ArtifactExport.objects.filter(pk=export.pk).update(status=ExportStatus.COPYING, attempts=1, claimed_at=long_ago)

    later = timezone.now() + timedelta(seconds=retry_wait(1) + 1)
    assert exports_due() == []
    export.refresh_from_db()
    assert (export.status, export.error, export.attempts) == (ExportStatus.PENDING, "the worker copying it stopped", 1)
    assert exports_due(now=later) == [str(export.pk)]


def test_the_wait_grows_fourfold_up_to_an_hour(settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "EXPORT_RETRY_SECONDS": 30.0}
    assert [retry_wait(n) for n in (1, 2, 3, 4, 5)] == [30, 120, 480, 1920, 3600]

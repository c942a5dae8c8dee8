"""An artifact uploaded again (a mounted artifact's next live upload, a
retried or later attempt's upload) replaces the complete one only once it is
complete itself: until then the old one stays listed and downloadable, and
then its row and its objects go. LocalStorage, real Postgres."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from backend.artifacts.models import Artifact, ArtifactStatus
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete, artifact_file_key
from backend.artifacts.storage import get_storage
from backend.core.errors import ApplicationError
from backend.runs.models import Job, Run


@pytest.fixture
def job(run: Run, settings: Any, tmp_path: Path) -> Job:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    return run.jobs.get()


def _upload(job: Job, files: dict[str, bytes], *, complete: bool = True) -> Artifact:
    manifest = [FileIn(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]
    artifact, uploads = artifact_begin(job=job, path="./output", files=manifest)
    for u in uploads:
        get_storage().write(f"{artifact.storage_prefix}/{u.path}", iter([files[u.path]]))
    return artifact_complete(artifact=artifact) if complete else artifact


def _on_disk(artifact: Artifact) -> bool:
    return all(get_storage().size(artifact_file_key(artifact, f)) is not None for f in artifact.files.all())


def test_a_new_upload_replaces_the_complete_one_only_once_it_is_complete(
    job: Job, django_capture_on_commit_callbacks: Any
) -> None:
    first = _upload(job, {"hello.txt": b"one"})
    second = _upload(job, {"hello.txt": b"two", "more.txt": b"x"}, complete=False)
    listed = list(Artifact.objects.filter(job=job).order_by("created_at"))
    assert [(a.pk, a.status) for a in listed] == [(first.pk, "complete"), (second.pk, "uploading")]
    assert _on_disk(first)

    with django_capture_on_commit_callbacks(execute=True):
        done = artifact_complete(artifact=second)
    assert [a.pk for a in Artifact.objects.filter(job=job)] == [done.pk]
    assert get_storage().size(f"{first.storage_prefix}/hello.txt") is None, "the old objects are deleted"
    assert _on_disk(done)


def test_an_upload_that_fails_leaves_the_last_complete_one(job: Job) -> None:
    first = _upload(job, {"hello.txt": b"one"})
    manifest = [FileIn("hello.txt", 3, hashlib.sha256(b"two").hexdigest())]
    broken, _ = artifact_begin(job=job, path="./output", files=manifest)  # never uploaded
    with pytest.raises(ApplicationError, match="missing or differ"):
        artifact_complete(artifact=broken)
    assert Artifact.objects.get(job=job, status=ArtifactStatus.COMPLETE).pk == first.pk
    assert _on_disk(first)
    again = _upload(job, {"hello.txt": b"three"})  # the next try replaces the broken one and then the first
    assert [a.pk for a in Artifact.objects.filter(job=job)] == [again.pk]


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("a\\..\\..\\x", "has a backslash"),
        ("C:\\x", "has a backslash"),
        ("C:x", "must be relative"),
        ("/etc/passwd", "must be relative"),
        # A NUL anywhere in a JSON body is refused by the API's parser, naming the key (backend/core/input.py).
        ("a\x00b", "contains a NUL character (U+0000) at files[0].path"),
        ("a\nb", "has a control character"),
        ("a//b", "without empty, '.' or '..' parts"),
        ("a/../b", "without empty, '.' or '..' parts"),
        ("a/", "without empty, '.' or '..' parts"),
        ("", "may not be blank"),
    ],
)
def test_a_bad_file_path_is_refused_with_its_reason_by_the_runner_api(job: Job, path: str, why: str) -> None:
    """Issue 11, item 22: every path, on the begin endpoints, answered 400 with the reason (a NUL was a 500)."""
    from rest_framework.test import APIClient

    from backend.clouds.models import Instance
    from backend.core.tokens import hash_token

    instance = Instance.objects.create(
        workspace_id=job.workspace_id, name="r", backend="local", status="busy", token_hash=hash_token("tok")
    )
    type(job).objects.filter(pk=job.pk).update(instance=instance, status="running", attempt=1)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer tok")
    body = {"path": "./output", "files": [{"path": path, "size": 1, "sha256": "a" * 64}]}
    answer = client.post(f"/api/v1/runner/jobs/{job.pk}/artifacts/?attempt=1", body, format="json")
    assert answer.status_code == 400, answer.content
    assert why in answer.json()["message"]
    assert not Artifact.objects.filter(job=job).exists()

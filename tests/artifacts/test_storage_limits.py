"""Issue 11, item 11: a workspace's storage quota (413 with the numbers), a
signed PUT bound to its declared size, and a re-begun artifact's abandoned
files removed. LocalStorage on disk, real Postgres, the real views."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from rest_framework.test import APIClient

from backend.accounts.models import Workspace
from backend.artifacts.models import Artifact, Blob
from backend.artifacts.quota import MIN_OBJECT_BYTES, storage_usage
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete
from backend.artifacts.storage import get_storage
from backend.clouds.models import Instance
from backend.core.tokens import hash_token
from backend.runs.models import Job, Run
from tests.support.fixtures import Person


@pytest.fixture
def job(run: Run, settings: Any, tmp_path: Path) -> Job:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path, "STORAGE_QUOTA_BYTES": 10_000}
    found = run.jobs.get()
    instance = Instance.objects.create(
        workspace_id=found.workspace_id, name="r", backend="local", status="busy", token_hash=hash_token("tok")
    )
    Job.objects.filter(pk=found.pk).update(instance=instance, status="running", attempt=1)
    return Job.objects.get(pk=found.pk)


@pytest.fixture
def runner() -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer tok")
    return client


def _manifest(files: dict[str, bytes]) -> list[dict[str, Any]]:
    return [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in files.items()]


def _begin(runner: APIClient, job: Job, files: dict[str, bytes], path: str = "./output") -> Any:
    body = {"path": path, "files": _manifest(files)}
    return runner.post(f"/api/v1/runner/jobs/{job.pk}/artifacts/?attempt=1", body, format="json")


def _put(client: Any, url: str, data: bytes, **extra: Any) -> Any:
    return client.generic("PUT", urlsplit(url).path, data, content_type="application/octet-stream", **extra)


def _stored(job: Job, files: dict[str, bytes]) -> Artifact:
    manifest = [FileIn(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]
    artifact, _ = artifact_begin(job=job, path="./kept", files=manifest)
    for p, d in files.items():
        get_storage().write(f"{artifact.storage_prefix}/{p}", iter([d]))
    return artifact_complete(artifact=artifact)


# ------------------------------------------------------------------ quota


def test_a_begin_over_the_workspace_quota_is_413_with_used_quota_and_requested(job: Job, runner: APIClient) -> None:
    _stored(job, {"w.bin": b"x" * 5_000})

    answer = _begin(runner, job, {"big.bin": b"y" * 6_000})

    assert answer.status_code == 413, answer.content
    body = answer.json()
    assert body["extra"] == {"used_bytes": 5_000, "quota_bytes": 10_000, "requested_bytes": 6_000}
    assert body["message"].startswith("This workspace's storage quota is full: 4.9 KiB (5,000 bytes) of 9.8 KiB")
    assert Artifact.objects.filter(job=job, path="./output").count() == 0
    assert _begin(runner, job, {"small.bin": b"y" * 4_500}).status_code == 201  # what fits, fits


def test_a_workspace_override_replaces_the_installation_quota(job: Job, runner: APIClient, team: Workspace) -> None:
    Workspace.objects.filter(pk=team.pk).update(storage_quota_bytes=100_000)
    assert _begin(runner, job, {"big.bin": b"y" * 50_000}).status_code == 201
    assert storage_usage(workspace_id=team.pk).quota == 100_000
    Workspace.objects.filter(pk=team.pk).update(storage_quota_bytes=1_000)
    assert _begin(runner, job, {"more.bin": b"z" * 2_000}).status_code == 413


def test_a_checkpoint_counts_only_the_files_it_uploads(job: Job, runner: APIClient, settings: Any) -> None:
    _stored(job, {"w.bin": b"x" * 6_000})
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "checkpoint": "./ckpt"})
    body = {"path": "./ckpt", "files": _manifest({"c.bin": b"c" * 5_000})}

    answer = runner.post(f"/api/v1/runner/jobs/{job.pk}/checkpoints/?attempt=1", body, format="json")

    assert answer.status_code == 413, answer.content
    assert answer.json()["extra"]["requested_bytes"] == 5_000


def test_a_code_blob_over_the_quota_is_413_before_it_is_stored(job: Job, owner: Person, team: Workspace) -> None:
    _stored(job, {"w.bin": b"x" * 9_000})

    answer = owner.client().generic(
        "POST", f"/api/v1/workspaces/{team.slug}/blobs/", b"z" * 2_000, content_type="application/octet-stream"
    )

    assert answer.status_code == 413, answer.content
    assert answer.json()["extra"] == {"used_bytes": 9_000, "quota_bytes": 10_000, "requested_bytes": 2_000}
    assert not Blob.objects.exists()
    assert not list((get_storage().root / "workspaces" / str(team.pk) / "blobs").glob("*"))


# ------------------------------------------------- every kind of stored byte


def test_empty_files_and_an_empty_artifact_each_count_the_minimum(job: Job, runner: APIClient) -> None:
    _stored(job, {"a": b""})
    assert storage_usage(workspace_id=job.workspace_id).used == MIN_OBJECT_BYTES

    empty = _begin(runner, job, {}, path="./nothing")
    assert empty.status_code == 201, empty.content
    assert storage_usage(workspace_id=job.workspace_id).used == 2 * MIN_OBJECT_BYTES

    more = _begin(runner, job, {"e": b""}, path="./empties")  # 0 bytes, but 3 * 4 KiB > 10,000
    assert more.status_code == 413, more.content
    assert more.json()["extra"] == {
        "used_bytes": 2 * MIN_OBJECT_BYTES,
        "quota_bytes": 10_000,
        "requested_bytes": MIN_OBJECT_BYTES,
    }
    assert not Artifact.objects.filter(job=job, path="./empties").exists()


def _environment(runner: APIClient, job: Job, size: int, key: str = "0" * 24) -> Any:
    body = {"key": key, "size": size, "sha256": "a" * 64}
    return runner.post(f"/api/v1/runner/jobs/{job.pk}/environment/?attempt=1", body, format="json")


def test_a_packed_environment_counts_from_its_begin_and_one_over_the_quota_is_refused(
    job: Job, runner: APIClient
) -> None:
    from backend.runs.models import EnvironmentArchive

    assert _environment(runner, job, 6_000).status_code == 200
    assert storage_usage(workspace_id=job.workspace_id).used == 6_000
    assert _begin(runner, job, {"big.bin": b"y" * 5_000}).status_code == 413  # the archive took the room

    refused = _environment(runner, job, 5_000, key="1" * 24)

    assert refused.status_code == 413, refused.content
    assert refused.json()["message"].startswith("This workspace's storage quota is full: 5.9 KiB (6,000 bytes)")
    assert refused.json()["extra"]["requested_bytes"] == 5_000
    assert list(EnvironmentArchive.objects.values_list("key", flat=True)) == ["0" * 24]


def test_an_archived_log_counts_and_leaves_less_room_for_uploads(job: Job, runner: APIClient) -> None:
    from datetime import UTC, datetime

    from backend.runs.services.logarchive import log_archive_job
    from backend.runs.services.logchunks import chunks_of, chunks_write

    text = "x" * 99
    chunks_write(str(job.pk), chunks_of(1, [(datetime.now(UTC).timestamp(), "o", text) for _ in range(60)]))
    assert storage_usage(workspace_id=job.workspace_id).used == 0  # lines in the database: the log cap's

    archive = log_archive_job(job_id=str(job.pk))

    assert archive is not None and archive.size == 6_000
    assert storage_usage(workspace_id=job.workspace_id).used == 6_000
    refused = _begin(runner, job, {"big.bin": b"y" * 5_000})
    assert refused.status_code == 413
    assert refused.json()["extra"]["used_bytes"] == 6_000


# ------------------------------------------------------- PUT bound to size


def test_a_signed_put_larger_than_declared_is_refused_and_nothing_is_stored(
    job: Job, runner: APIClient, client: Any
) -> None:
    data = b"m" * 1_000
    upload = _begin(runner, job, {"m.bin": data}).json()["uploads"][0]

    too_big = _put(client, upload["url"], data + b"more")

    assert too_big.status_code == 413, too_big.content
    assert too_big.json() == {
        "message": "The upload declares 1,004 bytes; this link takes 1,000 at most.",
        "extra": {"limit_bytes": 1_000},
    }
    ok = _put(client, upload["url"], data)
    assert ok.status_code == 201, ok.content


def test_a_signed_put_streaming_more_than_declared_is_cut_off() -> None:
    # Without a Content-Length (a chunked body), the storage stops reading at the first extra byte.
    from backend.artifacts.storage import TooLarge

    storage = get_storage()
    data = b"m" * 10
    with pytest.raises(TooLarge):
        storage.write_checked(
            "ws/x/m.bin", iter([data, b"extra" * 1000]), sha256=hashlib.sha256(data).hexdigest(), size=10
        )
    assert storage.size("ws/x/m.bin") is None


# --------------------------------------------------------------- re-begin


def test_re_beginning_an_artifact_removes_the_files_of_the_abandoned_attempt(
    job: Job, runner: APIClient, client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    first = _begin(runner, job, {"a.bin": b"1" * 100, "b.bin": b"2" * 100}).json()
    assert _put(client, first["uploads"][0]["url"], b"1" * 100).status_code == 201  # one file went up
    abandoned = Artifact.objects.get(pk=first["id"])
    on_disk = get_storage().root / f"{abandoned.storage_prefix}/a.bin"
    assert on_disk.exists()

    with django_capture_on_commit_callbacks(execute=True):
        again = _begin(runner, job, {"a.bin": b"1" * 100, "b.bin": b"2" * 100})

    assert again.status_code == 201
    assert not Artifact.objects.filter(pk=first["id"]).exists()
    assert not on_disk.exists()
    # The new manifest only: two files of 100 bytes, each counted at the minimum.
    assert storage_usage(workspace_id=job.workspace_id).used == 2 * MIN_OBJECT_BYTES


def test_the_cli_shows_the_quota_message_of_a_refused_code_upload(
    live_server: Any, transactional_db: None, job: Job, owner: Person, team: Workspace
) -> None:
    from trainyard.api import ApiError, Client

    _stored(job, {"w.bin": b"x" * 9_000})
    with Client(url=live_server.url, token=owner.token, workspace=team.slug) as cli, pytest.raises(ApiError) as refused:
        cli.upload_blob(b"z" * 2_000)

    assert refused.value.status == 413
    assert str(refused.value).startswith("This workspace's storage quota is full: 8.8 KiB (9,000 bytes) of 9.8 KiB")
    assert "(10,000 bytes) used, 2.0 KiB (2,000 bytes) more asked for. Delete runs" in str(refused.value)

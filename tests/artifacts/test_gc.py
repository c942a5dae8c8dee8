"""Issue 11, item 11: the storage garbage collector deletes only what no row
needs and only once it is older than the grace period: unreferenced code
blobs, unfinished uploads of finished jobs, stale temporary files, and local
files no row points at. A complete artifact, a checkpoint version (and the
files it carries from older ones) and a blob a run names are never touched."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.artifacts.checkpoints import checkpoint_begin, checkpoint_complete
from backend.artifacts.gc import GcReport, storage_gc
from backend.artifacts.models import Artifact, Blob
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete, artifact_file_key
from backend.artifacts.storage import get_storage
from backend.runs.models import Job, Run

DAY = 86400.0
GRACE = 7 * DAY


@pytest.fixture
def job(run: Run, settings: Any, tmp_path: Path) -> Job:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    found = run.jobs.get()
    Job.objects.filter(pk=found.pk).update(spec={**found.spec, "checkpoint": "./ckpt"})
    return Job.objects.get(pk=found.pk)


def _files(data: dict[str, bytes]) -> list[FileIn]:
    return [FileIn(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in data.items()]


def _write(prefix: str, data: dict[str, bytes], uploads: list[Any] | None = None) -> None:
    wanted = {u.path for u in uploads} if uploads is not None else set(data)
    for p, d in data.items():
        if p in wanted:
            get_storage().write(f"{prefix}/{p}", iter([d]))


def _age(*paths: Path, days: float = 8) -> None:
    when = time.time() - days * DAY
    for path in paths:
        os.utime(path, (when, when))


def _age_rows(model: Any, days: float = 8, **filters: Any) -> None:
    old = timezone.now() - timedelta(days=days)
    manager = model.stored if model is Artifact else model.objects
    manager.filter(**filters).update(created_at=old, updated_at=old)


def _disk(key: str) -> Path:
    return get_storage().root / key


def _blob(team: Workspace, data: bytes) -> Blob:
    blob = Blob.objects.create(workspace=team, size=len(data), sha256=hashlib.sha256(data).hexdigest(), storage_key="")
    key = f"workspaces/{team.pk}/blobs/{blob.pk}"
    get_storage().write(key, iter([data]))
    Blob.objects.filter(pk=blob.pk).update(storage_key=key)
    blob.refresh_from_db()
    return blob


def test_only_unreferenced_blobs_older_than_the_grace_period_go(
    job: Job, run: Run, team: Workspace, django_capture_on_commit_callbacks: Any
) -> None:
    used, old, young = _blob(team, b"used"), _blob(team, b"old"), _blob(team, b"young")
    Run.objects.filter(pk=run.pk).update(patch_blob=used)
    _age_rows(Blob, pk__in=[used.pk, old.pk])
    _age(*(_disk(b.storage_key) for b in (used, old, young)))

    with django_capture_on_commit_callbacks(execute=True):
        report = storage_gc(grace_seconds=GRACE)

    assert report.blobs == 1
    assert set(Blob.objects.values_list("pk", flat=True)) == {used.pk, young.pk}
    assert not _disk(old.storage_key).exists()
    assert _disk(used.storage_key).read_bytes() == b"used"
    assert _disk(young.storage_key).exists()


def test_an_unfinished_upload_of_a_finished_job_goes_with_its_files_and_a_complete_artifact_stays(
    job: Job, django_capture_on_commit_callbacks: Any
) -> None:
    model = {"w.bin": b"the trained model"}
    done, _ = artifact_begin(job=job, path="./model", files=_files(model))
    _write(done.storage_prefix, model)
    done = artifact_complete(artifact=done)
    half = {"a.bin": b"a", "b.bin": b"b"}
    abandoned, _ = artifact_begin(job=job, path="./other", files=_files(half))
    _write(abandoned.storage_prefix, {"a.bin": b"a"})  # one file went up, then the upload gave up
    _age_rows(Artifact, job=job)
    _age(*(p for p in get_storage().root.rglob("*") if p.is_file()))

    Job.objects.filter(pk=job.pk).update(status="running")
    with django_capture_on_commit_callbacks(execute=True):
        assert storage_gc(grace_seconds=GRACE).uploads == 0  # its job still runs: it may yet finish it
    Job.objects.filter(pk=job.pk).update(status="failed")
    with django_capture_on_commit_callbacks(execute=True):
        report = storage_gc(grace_seconds=GRACE)

    assert report.uploads == 1
    assert list(Artifact.stored.values_list("pk", flat=True)) == [done.pk]
    assert not _disk(f"{abandoned.storage_prefix}/a.bin").exists()
    assert _disk(f"{done.storage_prefix}/w.bin").read_bytes() == b"the trained model"


def test_stale_temporary_files_and_unreferenced_files_go_referenced_ones_never(
    job: Job, team: Workspace, django_capture_on_commit_callbacks: Any
) -> None:
    # Checkpoint version 2 carries v1's unchanged file: v1's object is referenced by v2's row.
    v1_files = {"same.bin": b"unchanged", "step.txt": b"1"}
    v1 = checkpoint_begin(job=job, attempt=1, path="./ckpt", files=_files(v1_files))
    _write(v1.version.storage_prefix, v1_files)
    checkpoint_complete(version=v1.version)
    v2_files = {"same.bin": b"unchanged", "step.txt": b"2"}
    v2 = checkpoint_begin(job=job, attempt=1, path="./ckpt", files=_files(v2_files))
    assert v2.carried == 1
    _write(v2.version.storage_prefix, v2_files, v2.uploads)
    checkpoint_complete(version=v2.version)
    root = get_storage().root / "workspaces" / str(team.pk)
    stale_tmp = root / "runs" / ".upload-abc123"
    fresh_tmp = root / "runs" / ".upload-def456"
    orphan = root / "runs" / "x" / "jobs" / "y" / "artifacts" / "gone" / "w.bin"
    for path in (stale_tmp, fresh_tmp, orphan):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"left behind")
    everything = [p for p in root.rglob("*") if p.is_file()]
    _age(*everything)
    _age(fresh_tmp, days=0)
    carried = v2.version.files.get(path="same.bin")

    with django_capture_on_commit_callbacks(execute=True):
        report = storage_gc(grace_seconds=GRACE)

    assert report == GcReport(blobs=0, uploads=0, temp_files=1, orphan_files=1)
    assert not stale_tmp.exists() and not orphan.exists()
    assert fresh_tmp.exists()
    assert _disk(artifact_file_key(v2.version, carried)).read_bytes() == b"unchanged"
    assert all(p.exists() for p in everything if p not in (stale_tmp, orphan))


def test_the_collector_is_a_periodic_celery_task_declared_in_code(settings: Any) -> None:
    from backend.artifacts import tasks
    from backend.config.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["storage-gc"]
    assert entry["task"] == "backend.artifacts.tasks.storage_gc" == tasks.storage_gc.name
    assert entry["schedule"] == timedelta(seconds=settings.TRAINYARD["GC_EVERY_SECONDS"])
    assert "backend.artifacts.tasks.storage_gc" in app.tasks

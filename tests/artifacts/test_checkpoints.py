"""Checkpoint versions on the local storage (real Postgres, real files):
unchanged files are carried by reference, a version becomes the latest only
once every file is verified and by one compare-and-set, pruning keeps N
versions and every object a kept version points at; outputs never list
checkpoint versions."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from backend.artifacts.checkpoints import (
    checkpoint_begin,
    checkpoint_complete,
    checkpoint_latest,
    checkpoint_prune,
    checkpoint_spec,
)
from backend.artifacts.models import Artifact, ArtifactStatus
from backend.artifacts.services import FileIn, artifact_file_key
from backend.artifacts.storage import get_storage
from backend.core.errors import ApplicationError
from backend.runs.models import Job, Run


@pytest.fixture
def job(run: Run, settings: Any, tmp_path: Path) -> Job:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path, "CHECKPOINT_KEEP": 2}
    found: Job = run.jobs.get()
    found.spec = {**found.spec, "checkpoint": "./ckpt"}
    found.attempt = 1
    found.save(update_fields=["spec", "attempt"])
    return found


def _sync(job: Job, files: dict[str, bytes], *, upload: bool = True) -> Artifact:
    """One version as a runner makes it: begin, PUT what was asked for (here:
    written straight to the storage), complete."""
    manifest = [FileIn(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]
    begun = checkpoint_begin(job=job, attempt=job.attempt, path="./ckpt", files=manifest)
    if upload:
        for u in begun.uploads:
            get_storage().write(f"{begun.version.storage_prefix}/{u.path}", iter([files[u.path]]))
    version: Artifact = begun.version
    version.uploaded = [u.path for u in begun.uploads]  # type: ignore[attr-defined]
    return version


def test_unchanged_files_are_carried_and_only_changed_ones_uploaded(job: Job) -> None:
    first = checkpoint_complete(version=_sync(job, {"big.bin": b"x" * 1000, "step": b"1"}))
    second = _sync(job, {"big.bin": b"x" * 1000, "step": b"2"})

    assert second.uploaded == ["step"]  # type: ignore[attr-defined]
    second = checkpoint_complete(version=second)
    assert (first.number, second.number) == (1, 2)
    assert second.storage_prefix.endswith(f"/runs/{job.run_id}/jobs/{job.pk}/checkpoints/1/2")
    big = second.files.get(path="big.bin")
    assert artifact_file_key(second, big) == f"{first.storage_prefix}/big.bin"
    assert checkpoint_latest(job=job) == second
    spec = checkpoint_spec(job=job)
    assert spec is not None and spec.version == 2 and [f.path for f in spec.files] == ["big.bin", "step"]
    assert not Artifact.objects.filter(job=job).exists()  # outputs only: checkpoints are not artifacts


def test_a_version_with_a_missing_file_never_becomes_the_latest(job: Job) -> None:
    good = checkpoint_complete(version=_sync(job, {"step": b"1"}))
    half = _sync(job, {"step": b"2"}, upload=False)

    with pytest.raises(ApplicationError, match="missing or differ"):
        checkpoint_complete(version=half)

    assert checkpoint_latest(job=job) == good
    half.refresh_from_db()
    assert half.status == ArtifactStatus.UPLOADING


def test_a_retried_complete_of_the_latest_is_answered_again(job: Job) -> None:
    version = checkpoint_complete(version=_sync(job, {"step": b"1"}))

    assert checkpoint_complete(version=version) == version
    assert checkpoint_latest(job=job) == version


def test_the_latest_moves_only_from_the_version_a_sync_was_based_on(job: Job) -> None:
    checkpoint_complete(version=_sync(job, {"step": b"1"}))
    a = _sync(job, {"step": b"2"})
    b = _sync(job, {"step": b"3"})  # begun while a was under way: same base
    checkpoint_complete(version=a)

    with pytest.raises(ApplicationError, match="no longer the latest"):
        checkpoint_complete(version=b)

    assert checkpoint_latest(job=job) == a


def test_pruning_keeps_n_versions_and_the_objects_they_point_at(job: Job, tmp_path: Path) -> None:
    checkpoint_complete(version=_sync(job, {"big.bin": b"b" * 100, "step": b"1"}))
    abandoned = _sync(job, {"big.bin": b"b" * 100, "step": b"x"})  # never completed
    for step in (b"2", b"3", b"4"):
        checkpoint_complete(version=_sync(job, {"big.bin": b"b" * 100, "step": step}))

    versions = list(Artifact.stored.filter(job=job).order_by("number"))
    assert [(v.number, v.status) for v in versions] == [(4, "complete"), (5, "complete")]
    assert abandoned.number == 2
    on_disk = {
        p.relative_to(tmp_path).as_posix().split("/checkpoints/1/")[1] for p in tmp_path.rglob("*") if p.is_file()
    }
    # Version 1's big.bin is still carried by 4 and 5; its step and 2's and 3's objects are gone.
    assert on_disk == {"1/big.bin", "4/step", "5/step"}
    assert checkpoint_prune(job_id=str(job.pk), keep=2) == 0
    latest = checkpoint_latest(job=job)
    assert latest is not None and latest.number == 5


def test_a_run_with_checkpoints_can_be_deleted(job: Job) -> None:
    checkpoint_complete(version=_sync(job, {"step": b"1"}))
    checkpoint_complete(version=_sync(job, {"step": b"2"}))

    job.run.delete()

    assert not Artifact.stored.filter(job_id=job.pk).exists()

"""A workflow's ``cache:`` (backend/artifacts/caches.py), LocalStorage and
real Postgres: a saving goes up like a checkpoint version (unchanged files
carried, not uploaded), becomes what the next job of the workflow in the
workspace restores, and replaces the older savings with their objects, but
not the objects the new one still points at, and only once the restore URLs
that name them have expired."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from backend.artifacts.caches import cache_begin, cache_complete, cache_latest, cache_specs, caches_replaced_delete
from backend.artifacts.checkpoints import DOWNLOAD_URL_SECONDS
from backend.artifacts.models import Artifact, ArtifactKind
from backend.artifacts.services import FileIn, artifact_file_key
from backend.artifacts.storage import get_storage
from backend.core.errors import ApplicationError
from backend.runs.models import Job, Run


@pytest.fixture
def job(run: Run, settings: Any, tmp_path: Path) -> Job:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    found: Job = run.jobs.get()
    found.spec = {**found.spec, "cache": ["./models", "~/.cache/pip"]}
    found.attempt = 1
    found.save(update_fields=["spec", "attempt"])
    return found


def _save(job: Job, files: dict[str, bytes]) -> tuple[Artifact, list[str]]:
    manifest = [FileIn(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]
    begun = cache_begin(job=job, attempt=1, path="./models", files=manifest)
    for u in begun.uploads:
        get_storage().write(f"{begun.version.storage_prefix}/{u.path}", iter([files[u.path]]))
    return cache_complete(saving=begun.version), [u.path for u in begun.uploads]


def test_a_saving_carries_unchanged_files_and_replaces_the_older_one(job: Job) -> None:
    first, uploaded = _save(job, {"a.bin": b"aaa", "b.bin": b"bbb"})
    assert sorted(uploaded) == ["a.bin", "b.bin"]
    second, uploaded = _save(job, {"a.bin": b"aaa", "b.bin": b"BBB", "c.bin": b"c"})
    assert sorted(uploaded) == ["b.bin", "c.bin"], "a.bin is carried"

    assert cache_latest(job=job, path="./models") == second
    [models, pip] = cache_specs(job=job)
    assert (models.path, sorted(f.path for f in models.files)) == ("./models", ["a.bin", "b.bin", "c.bin"])
    assert (pip.path, pip.files) == ("~/.cache/pip", [])

    assert caches_replaced_delete(now=timezone.now() + timedelta(seconds=DOWNLOAD_URL_SECONDS + 1)) == 1
    assert list(Artifact.stored.filter(kind=ArtifactKind.CACHE)) == [second], "the older saving is gone"
    storage = get_storage()
    for f in second.files.all():
        assert storage.size(artifact_file_key(second, f)) == f.size, f"{f.path} is still stored"
    assert storage.size(f"{first.storage_prefix}/b.bin") is None, "the old b.bin went with the older saving"


def test_a_replaced_saving_stays_while_a_restore_url_may_name_it(job: Job) -> None:
    first, _ = _save(job, {"a.bin": b"aaa", "b.bin": b"bbb"})
    [restoring, _pip] = cache_specs(job=job)  # a job starts restoring the first saving
    second, _ = _save(job, {"b.bin": b"BBB"})
    storage = get_storage()

    assert caches_replaced_delete(now=timezone.now()) == 0
    assert caches_replaced_delete(now=timezone.now() + timedelta(seconds=DOWNLOAD_URL_SECONDS - 5)) == 0
    assert set(Artifact.stored.filter(kind=ArtifactKind.CACHE)) == {first, second}
    for f in first.files.all():  # every object the restoring job's URLs name is still there
        assert storage.size(artifact_file_key(first, f)) == f.size
    assert {f.path for f in restoring.files} == {"a.bin", "b.bin"}

    assert caches_replaced_delete(now=timezone.now() + timedelta(seconds=DOWNLOAD_URL_SECONDS + 5)) == 1
    assert storage.size(f"{first.storage_prefix}/a.bin") is None
    assert storage.size(f"{first.storage_prefix}/b.bin") is None
    assert cache_latest(job=job, path="./models") == second


def test_only_a_cache_path_of_the_job_can_be_saved(job: Job) -> None:
    with pytest.raises(ApplicationError, match="is not a cache: path of this job"):
        cache_begin(job=job, attempt=1, path="./elsewhere", files=[])


def _job_of(person: Any, workspace: Any, repo_url: str, settings_cache: list[str]) -> Job:
    from backend.runs.services.runs import CodeInput, run_create
    from tests.support.fixtures import WORKFLOWS

    run = run_create(
        workspace=workspace,
        user=person.user,
        workflow="hello",
        workflows_file_path=".trainyard/workflows.yaml",
        workflows_file_text=WORKFLOWS,
        code=CodeInput(kind="git", repo_url=repo_url, commit="b" * 40),
        env={},
    )
    found: Job = run.jobs.get()
    found.spec = {**found.spec, "cache": settings_cache}
    found.attempt = 1
    found.save(update_fields=["spec", "attempt"])
    return found


def test_a_cache_saved_for_one_repository_is_not_restored_for_another(job: Job, member: Any, team: Any) -> None:
    other_repo = _job_of(member, team, "https://example.com/mallory/other.git", ["./models"])
    saved, _ = _save(other_repo, {"model.bin": b"poisoned"})

    assert [f.path for f in cache_specs(job=other_repo)[0].files] == ["model.bin"]
    assert cache_specs(job=job)[0].files == [], "a job of acme/models restores nothing saved by other.git"
    assert cache_latest(job=job, path="./models") is None

    same_repo = _job_of(member, team, "https://example.com/mallory/other.git", ["./models"])
    assert cache_latest(job=same_repo, path="./models") == saved
    assert saved.job.run.submitted_by == member.user  # who saved it

    mine, _ = _save(job, {"model.bin": b"honest"})
    assert cache_latest(job=job, path="./models") == mine
    assert cache_latest(job=same_repo, path="./models") == saved, "saving for acme/models replaces nothing of other.git"


def test_a_saving_over_the_storage_quota_is_413_and_carried_files_take_no_room(job: Job, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_QUOTA_BYTES": 20_000}
    _save(job, {"big.bin": b"b" * 12_000})

    with pytest.raises(ApplicationError) as refused:
        _save(job, {"big.bin": b"B" * 12_000})  # changed: 12,000 more bytes would be stored

    assert refused.value.status_code == 413
    assert refused.value.extra == {"used_bytes": 12_000, "quota_bytes": 20_000, "requested_bytes": 12_000}
    assert str(refused.value).startswith("This workspace's storage quota is full")
    assert Artifact.stored.filter(kind=ArtifactKind.CACHE).count() == 1, "nothing of the refused saving is recorded"
    _, uploaded = _save(job, {"big.bin": b"b" * 12_000, "small.bin": b"s" * 5_000})
    assert uploaded == ["small.bin"]  # big.bin is carried: only 5,000 more bytes

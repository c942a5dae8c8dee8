"""Archived logs (``services/logarchive.py``): a finished job's chunks
become one object in its workspace's storage (the server's disk, or its S3
bucket on moto), every reader gives back the lines that were stored, a
failed write loses nothing, and retention removes the object."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from django.db import transaction
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.artifacts.gc import storage_gc
from backend.runs.models import Job, JobStatus, LogArchive, LogChunk, Run, RunStatus
from backend.runs.selectors import job_log_lines, job_log_page
from backend.runs.services.logarchive import log_archive_job, logs_archive
from backend.runs.services.logchunks import LogArchiveGone, chunks_of, chunks_write
from backend.runs.services.loglimits import logs_prune
from backend.runs.services.rawlog import RawLogRange, raw_log_chunks
from tests.support.fixtures import Person
from tests.support.moto import MotoServer, s3_account

pytestmark = pytest.mark.django_db(transaction=True)

TEXTS = ["plain", "tab\there", "cr\rprogress", "nul\x00byte", "", "ünïcödé ✓", "x" * 70_000]


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Path) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path, "LOG_ARCHIVE_AFTER_SECONDS": 60.0}


def _finished(run: Run, lines: int, *, ago: float = 120) -> Job:
    job = run.jobs.get()
    texts = [TEXTS[i % len(TEXTS)] + f" {i + 1}" for i in range(lines)]
    chunks_write(str(job.pk), chunks_of(1, [(1_800_000_000.25 + i, "oe"[i % 5 == 0], t) for i, t in enumerate(texts)]))
    ended = timezone.now() - timedelta(seconds=ago)
    Job.objects.filter(pk=job.pk).update(status=JobStatus.SUCCEEDED, finished_at=ended, last_seq=lines)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, finished_at=ended)
    return Job.objects.get(pk=job.pk)


def _raw(job: Job, **wanted: Any) -> bytes:
    return b"".join(raw_log_chunks(job=job, wanted=RawLogRange(**wanted)))


def _reads(job: Job) -> dict[str, Any]:
    return {
        "lines": job_log_lines(job_id=str(job.pk)),
        "page": job_log_page(job=job, after_seq=1995, limit=10, max_bytes=1 << 20),
        "raw": _raw(job),
        "range": _raw(job, from_seq=999, to_seq=1003, timestamps=True),
        "tail": _raw(job, tail=3),
    }


def test_a_finished_jobs_log_becomes_one_object_and_reads_back_the_same(run: Run, tmp_path: Path) -> None:
    job = _finished(run, 2500)
    before = _reads(job)

    assert logs_archive() == 1

    archive = LogArchive.objects.get(job=job)
    data = (tmp_path / archive.key).read_bytes()
    assert data == before["raw"] and archive.size == len(data) and archive.last_seq == 2500
    assert archive.key.startswith(f"workspaces/{job.workspace_id}/runs/{job.run_id}/jobs/{job.pk}/log-")
    assert not LogChunk.objects.filter(job=job, archive_offset__isnull=True).exists()
    assert {bytes(t) for t in LogChunk.objects.filter(job=job).values_list("text", flat=True)} == {b""}
    assert _reads(job) == before
    assert logs_archive() == 0  # once


def test_a_running_job_or_one_that_just_ended_is_not_archived(run: Run) -> None:
    job = _finished(run, 10, ago=5)
    assert logs_archive() == 0
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING, finished_at=None)
    assert logs_archive() == 0
    assert not LogArchive.objects.exists()


def test_a_job_that_ended_before_the_window_stays_in_its_rows(run: Run) -> None:
    """A pass walks the jobs that ended in the last week (an index range);
    an older log (archiving was off then) is left where it is, readable."""
    job = _finished(run, 10, ago=8 * 86400)
    assert logs_archive() == 0
    assert len(job_log_lines(job_id=str(job.pk))) == 10


def test_lines_stored_after_the_archive_are_read_after_it(run: Run) -> None:
    job = _finished(run, 1200)
    assert log_archive_job(job_id=str(job.pk)) is not None
    chunks_write(str(job.pk), chunks_of(1201, [(1_800_009_999.0, "o", "a late line")]))
    Job.objects.filter(pk=job.pk).update(last_seq=1201)

    lines = job_log_lines(job_id=str(job.pk), after_seq=1198)
    assert [(seq, text) for seq, _, _, text in lines] == [
        (1199, TEXTS[1198 % len(TEXTS)] + " 1199"),
        (1200, TEXTS[1199 % len(TEXTS)] + " 1200"),
        (1201, "a late line"),
    ]
    assert _raw(job, tail=2).endswith(b" 1200\na late line\n")


def test_a_write_that_fails_leaves_every_line_in_the_database(run: Run, tmp_path: Path) -> None:
    job = _finished(run, 300)
    before = _reads(job)
    # A file where the job's folder must go: the object cannot be written (as a full or broken disk).
    blocker = tmp_path / f"workspaces/{job.workspace_id}/runs/{job.run_id}/jobs"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the way")

    assert logs_archive() == 0

    assert not LogArchive.objects.exists()
    assert not LogChunk.objects.filter(job=job, archive_offset__isnull=False).exists()
    assert _reads(job) == before
    blocker.unlink()
    assert logs_archive() == 1 and _reads(job) == before


def test_storage_gc_keeps_an_archived_log_and_retention_removes_it(run: Run, tmp_path: Path, settings: Any) -> None:
    job = _finished(run, 50)
    logs_archive()
    archive = LogArchive.objects.get(job=job)
    path = tmp_path / archive.key

    storage_gc(grace_seconds=0)
    assert path.exists()

    settings.TRAINYARD = {**settings.TRAINYARD, "LOG_RETENTION_DAYS": 1}
    assert logs_prune(now=timezone.now() + timedelta(days=2)) == 1
    assert not path.exists() and not LogArchive.objects.exists() and job_log_lines(job_id=str(job.pk)) == []


def test_a_workspace_with_a_bucket_archives_there(aws: MotoServer, team: Workspace, run: Run) -> None:
    s3_account(team, bucket="ty-logs")
    job = _finished(run, 1500)
    before = _reads(job)

    assert logs_archive() == 1

    archive = LogArchive.objects.get(job=job)
    assert archive.storage_bucket == "ty-logs"
    body = boto3.client("s3", region_name="us-east-1").get_object(Bucket="ty-logs", Key=archive.key)["Body"].read()
    assert body == before["raw"]
    assert _reads(job) == before


def test_retention_whose_transaction_fails_leaves_the_archived_log_whole(
    run: Run, tmp_path: Path, settings: Any
) -> None:
    job = _finished(run, 50)
    logs_archive()
    archive = LogArchive.objects.get(job=job)
    before = _reads(job)
    settings.TRAINYARD = {**settings.TRAINYARD, "LOG_RETENTION_DAYS": 1}

    with pytest.raises(RuntimeError, match="fails"), transaction.atomic():
        assert logs_prune(now=timezone.now() + timedelta(days=2)) == 1
        raise RuntimeError("the pass's transaction fails after the deletes")

    assert (tmp_path / archive.key).exists()
    assert LogArchive.objects.filter(pk=archive.pk).exists()
    assert _reads(job) == before
    assert logs_prune(now=timezone.now() + timedelta(days=2)) == 1  # the next pass deletes it
    assert not (tmp_path / archive.key).exists() and job_log_lines(job_id=str(job.pk)) == []


@pytest.mark.parametrize("gone", ["row", "row and object"])
def test_a_log_deleted_by_retention_while_it_is_read_is_a_410_not_a_server_error(
    run: Run, owner: Person, tmp_path: Path, gone: str
) -> None:
    """Retention deletes the archive row and the chunks, then (once that
    commits) the archive's object. A read that got the chunk rows before
    that commit finds the row, or the object too, gone: the states such a
    read meets, made by hand."""
    job = _finished(run, 50)
    logs_archive()
    archive = LogArchive.objects.get(job=job)
    LogArchive.objects.filter(pk=archive.pk).delete()
    if gone == "row and object":
        (tmp_path / archive.key).unlink()

    with pytest.raises(LogArchiveGone):
        job_log_lines(job_id=str(job.pk))
    answer = owner.client().get(f"/api/v1/workspaces/{run.workspace.slug}/jobs/{job.pk}/logs/")

    assert answer.status_code == 410, answer.content
    assert "deleted (log retention) while it was being read" in answer.json()["message"]

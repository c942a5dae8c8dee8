"""Compacting a finished job's log into one object in its workspace's
storage (Celery beat: ``logs-archive``; docs/LOGS.md, "Archive").

A job that ended more than TRAINYARD_LOG_ARCHIVE_AFTER_SECONDS ago (its
runner has long shipped its last lines) gets its chunks' texts written, in
seq order, as one object: the plain log. Where the workspace stores (its S3
bucket, else the server's storage), under
``<root>/runs/<run>/jobs/<job>/log-<id>.txt``. Then, in one transaction
holding the job's row lock, every chunk that went into the object has its
text emptied and its ``archive_offset`` set, and a ``LogArchive`` row says
where the object is. The database keeps the index (seqs, streams, times).

Nothing is lost on the way:

1. The chunks' texts are emptied only after the object is written and
   storage reports it whole (its size is the sum of the texts').
2. Only the chunks read for the object are touched; a line stored while the
   object was being written (a late straggler) stays in its row, and
   readers take each chunk from where it is.
3. Any failure leaves the rows as they were and removes the object; the
   next pass tries again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from backend.artifacts.locations import location_of, storage_for_new, storage_of
from backend.artifacts.storage import delete_after_commit, delete_quietly
from backend.runs.models import FINISHED_JOB, Job, LogArchive, LogChunk

logger = logging.getLogger(__name__)

ARCHIVE_JOBS_PER_PASS = 50
ARCHIVE_BUDGET_SECONDS = 240.0  # per call; the task's time limit is 300 s
READ_CHUNKS = 64
# Each pass looks at jobs that ended within this window (an index range, not
# every finished job ever): a log not archived by then (archiving was off,
# or storage failed for a week) stays in its chunk rows, readable as ever.
ARCHIVE_WINDOW = timedelta(days=7)


class ArchiveFailed(Exception):
    pass


def logs_archive(*, now: datetime | None = None, budget_seconds: float = ARCHIVE_BUDGET_SECONDS) -> int:
    """Archive the logs of jobs that ended long enough ago, oldest first,
    until none is left or ``budget_seconds`` have passed; how many were
    archived. A job whose archive fails is logged and left for the next pass."""
    after = settings.TRAINYARD["LOG_ARCHIVE_AFTER_SECONDS"]
    if after <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(seconds=after)
    oldest = cutoff - ARCHIVE_WINDOW
    deadline, archived = time.monotonic() + budget_seconds, 0
    failed: set[uuid.UUID] = set()
    while time.monotonic() < deadline:
        waiting = LogChunk.objects.filter(job_id=OuterRef("pk"), archive_offset__isnull=True)
        ids = list(
            Job.objects.filter(status__in=FINISHED_JOB, finished_at__range=(oldest, cutoff), log_pruned_at__isnull=True)
            .filter(log_archive__isnull=True)
            .filter(Exists(waiting))
            .exclude(pk__in=failed)
            .order_by("finished_at")
            .values_list("pk", flat=True)[:ARCHIVE_JOBS_PER_PASS]
        )
        if not ids:
            break
        for job_id in ids:
            try:
                if log_archive_job(job_id=str(job_id)) is not None:
                    archived += 1
            except Exception:
                logger.exception("job %s: archiving its log failed; the next pass tries again", job_id)
                failed.add(job_id)
    return archived


def log_archive_job(*, job_id: str) -> LogArchive | None:
    """Write the job's stored chunks as one object and point the chunks at
    it; None when there is nothing to archive or it is archived already."""
    job = Job.objects.filter(pk=job_id).only("pk", "run_id", "workspace_id").first()
    if job is None or LogArchive.objects.filter(job_id=job_id).exists():
        return None
    rows = list(
        LogChunk.objects.filter(job_id=job_id, archive_offset__isnull=True)
        .order_by("first_seq")
        .values_list("first_seq", "last_seq", "size")
    )
    if not rows:
        return None
    offsets, total = [], 0
    for _, _, size in rows:
        offsets.append(total)
        total += size
    storage = storage_for_new(workspace_id=job.workspace_id)
    key = f"{storage.key_root(job.workspace_id)}/runs/{job.run_id}/jobs/{job.pk}/log-{uuid.uuid4().hex[:12]}.txt"
    try:
        written = storage.write(key, _texts(job_id, [first for first, _, _ in rows]))
        found = storage.size(key)
        if written != total or found != total:
            raise ArchiveFailed(f"job {job_id}: the archive holds {found} bytes, its chunks {total}")
        archive = _point_chunks_at(job, rows, offsets, key=key, size=total, storage_fields=location_of(storage))
    except BaseException:
        delete_quietly(storage, [key], "an unused log archive")
        raise
    if archive is None:
        delete_quietly(storage, [key], "an unused log archive")
        return None
    logger.info("job %s: log archived (%d chunks, %d bytes) as %s", job_id, len(rows), total, key)
    return archive


def log_archive_delete(*, job_id: str) -> None:
    """Remove the job's archive (retention): its row now, its object once
    the caller's transaction commits, so one that fails leaves the archive
    whole and readable. The caller deletes the chunk rows."""
    archive = LogArchive.objects.filter(job_id=job_id).first()
    if archive is None:
        return
    storage, key = storage_of(archive), archive.key
    archive.delete()
    delete_after_commit(storage, [key], f"the log archive of job {job_id}")


def _texts(job_id: str, firsts: list[int]) -> Iterator[bytes]:
    for start in range(0, len(firsts), READ_CHUNKS):
        wanted = firsts[start : start + READ_CHUNKS]
        texts = dict(LogChunk.objects.filter(job_id=job_id, first_seq__in=wanted).values_list("first_seq", "text"))
        for first in wanted:
            yield bytes(texts[first])


def _point_chunks_at(
    job: Job,
    rows: list[tuple[int, int, int]],
    offsets: list[int],
    *,
    key: str,
    size: int,
    storage_fields: dict[str, object],
) -> LogArchive | None:
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=job.pk).values_list("pk", flat=True).first()
        if LogArchive.objects.filter(job_id=job.pk).exists():
            return None
        firsts = [first for first, _, _ in rows]
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE runs_logchunk c SET text = ''::bytea, archive_offset = u.off
                FROM unnest(%s::bigint[], %s::bigint[]) AS u(first, off)
                WHERE c.job_id = %s AND c.first_seq = u.first AND c.archive_offset IS NULL
                """,
                [firsts, offsets, str(job.pk)],
            )
            if cursor.rowcount != len(rows):
                raise ArchiveFailed(f"job {job.pk}: {cursor.rowcount} of {len(rows)} chunks were still there")
        return LogArchive.objects.create(
            workspace_id=job.workspace_id,
            job=job,
            key=key,
            size=size,
            last_seq=max(last for _, last, _ in rows),
            **storage_fields,
        )

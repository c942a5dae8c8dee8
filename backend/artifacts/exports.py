"""Copies of a job's artifacts to the place its workflow names
(``artifacts: - path: ./model, to: s3://bucket/prefix/${{ run.name }}/``).

Rules kept:

- An export belongs to one job of one run and one artifact path
  (``ArtifactExport``), whatever stored upload it copies: a job reused from
  the cache copies its source's artifact to its own run's destination.
- It begins when the artifact is stored (``export_begin``, in the
  transaction that makes the artifact complete) or when a job is reused
  (``exports_begin_reused_on_commit``), and is sent to a worker once that commits.
- One attempt (``export_attempt``) claims the export by compare-and-set
  (pending and due → copying), copies every file, and records the outcome
  only if the export still copies the same upload under the same claim. A
  failure waits ``EXPORT_RETRY_SECONDS`` × 4ⁿ and is tried again, up to
  ``EXPORT_ATTEMPTS`` attempts; then it is failed with the last reason.
- Nothing is lost with a worker: the beat's sweep (``exports_due``) sends
  every pending export that is due and takes back a copying one whose
  claim is older than an attempt may last.
- The stored artifact is only read: a failed copy never changes it.
- Copies are server-side (S3 CopyObject, in parts above 5 GB) when the
  artifact is in S3 and the destination's credentials can read it; else each
  file is streamed from the artifact's storage to the destination.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from uuid import UUID

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from trainyard_spec.schema import export_destination

from backend.artifacts.locations import storage_of
from backend.artifacts.models import Artifact, ArtifactExport, ArtifactStatus, ExportStatus
from backend.artifacts.s3 import S3Storage
from backend.artifacts.storage import Storage
from backend.clouds.backends.aws import s3
from backend.core.enqueue import enqueue
from backend.core.errors import ApplicationError
from backend.data.sources import s3_access
from backend.runs.models import Job

logger = logging.getLogger(__name__)

# How long one attempt may copy (the task's hard limit); a claim older than
# this plus a margin belonged to a worker that died.
ATTEMPT_SECONDS = 6 * 3600
STALE_CLAIM = timedelta(seconds=ATTEMPT_SECONDS + 300)
MAX_WAIT_SECONDS = 3600
COPY_THREADS = 8
ERROR_CHARS = 1000


@dataclass(frozen=True)
class Copied:
    objects: int
    size: int
    method: str  # "server-side" | "streamed"


def export_begin(*, job: Job, artifact: Artifact) -> ArtifactExport | None:
    """Start (or start over) the copy of ``artifact`` for ``job`` when its
    workflow names a ``to:`` for the artifact's path; None when it does not."""
    to = (job.spec.get("exports") or {}).get(artifact.path)
    if not to:
        return None
    destination = export_destination(to, run_name=job.run.name, job_name=job.name, workflow_name=job.workflow)
    export, _ = ArtifactExport.objects.update_or_create(
        job=job,
        path=artifact.path,
        defaults={
            "workspace_id": job.workspace_id,
            "run_id": job.run_id,
            "artifact": artifact,
            "destination": destination,
            "status": ExportStatus.PENDING,
            "attempts": 0,
            "error": "",
            "next_attempt_at": timezone.now(),
            "claimed_at": None,
            "done_at": None,
            "objects_copied": 0,
            "bytes_copied": 0,
            "method": "",
        },
    )
    enqueue("backend.artifacts.tasks.artifact_export", str(export.pk))
    return export


def exports_begin_reused_on_commit(*, job_id: UUID | str, source_id: UUID | str) -> None:
    """Once the caller commits, copy a reused job's source artifacts to this
    job's destinations: a run's name is final only then (its submission
    numbers it last, and may reuse jobs before)."""
    transaction.on_commit(partial(_begin_reused, job_id, source_id))


def _begin_reused(job_id: UUID | str, source_id: UUID | str) -> None:
    try:
        job = Job.objects.select_related("run").get(pk=job_id)
        paths = list((job.spec.get("exports") or {}).keys())
        stored = Artifact.objects.filter(job_id=source_id, path__in=paths, status=ArtifactStatus.COMPLETE)
        with transaction.atomic():
            for artifact in stored:
                export_begin(job=job, artifact=artifact)
    except Exception:  # the job is reused all the same; its copy is what is lost, and said so in the log
        logger.exception("job %s: could not begin the exports of its reused artifacts", job_id)


def export_attempt(*, export_id: UUID | str) -> str:
    """One attempt at copying the export, if it is pending and due; returns what happened."""
    claimed_at = timezone.now()
    claimed = ArtifactExport.objects.filter(
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=claimed_at),
        pk=export_id,
        status=ExportStatus.PENDING,
    ).update(status=ExportStatus.COPYING, claimed_at=claimed_at, attempts=F("attempts") + 1)
    if not claimed:
        return "not due"
    export = ArtifactExport.objects.select_related("artifact").get(pk=export_id)
    try:
        copied = _copy(export)
    except Exception as e:  # every failure is recorded and retried; the stored artifact is untouched
        logger.info("export %s: attempt %s failed: %s", export.pk, export.attempts, e)
        return _failed(export, claimed_at=claimed_at, reason=_reason(e))
    done = ArtifactExport.objects.filter(
        pk=export.pk, status=ExportStatus.COPYING, claimed_at=claimed_at, artifact=export.artifact
    ).update(
        status=ExportStatus.DONE,
        done_at=timezone.now(),
        error="",
        next_attempt_at=None,
        objects_copied=copied.objects,
        bytes_copied=copied.size,
        method=copied.method,
    )
    return f"copied {copied.objects} object(s) {copied.method}" if done else "superseded"


def exports_due(*, now: datetime | None = None) -> list[str]:
    """Send every pending export that is due, after taking back the copying
    ones whose worker died (their claim is stale). Returns the ids sent."""
    now = now or timezone.now()
    with transaction.atomic():
        stale = ArtifactExport.objects.select_for_update(skip_locked=True).filter(
            status=ExportStatus.COPYING, claimed_at__lt=now - STALE_CLAIM
        )
        for export in stale:
            _after_failure(export, claimed_at=export.claimed_at, reason="the worker copying it stopped", now=now)
    due = ArtifactExport.objects.filter(
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now), status=ExportStatus.PENDING
    ).values_list("pk", flat=True)
    ids = [str(pk) for pk in due[:1000]]
    for pk in ids:
        enqueue("backend.artifacts.tasks.artifact_export", pk, after_commit=False)
    return ids


def retry_wait(attempts: int) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones."""
    base = float(settings.TRAINYARD["EXPORT_RETRY_SECONDS"])
    return float(min(base * 4 ** max(attempts - 1, 0), MAX_WAIT_SECONDS))


# ---------------------------------------------------------------- copying


def _copy(export: ArtifactExport) -> Copied:
    """1. Find the stored files; 2. get the destination's credentials;
    3. copy each file server-side if they can read it in S3, else stream it."""
    artifact = export.artifact
    if artifact is None:
        raise ApplicationError(f"the stored artifact {export.path} is gone (deleted by retention or a newer upload)")
    bucket, _, prefix = export.destination.removeprefix("s3://").partition("/")
    files = list(artifact.files.all())
    storage = storage_of(artifact)
    access = s3_access(workspace_id=export.workspace_id, bucket=bucket)
    keys = {f.path: f.key or f"{artifact.storage_prefix}/{f.path}" for f in files}
    server_side = _within_s3(storage, access.client, access.source, next(iter(keys.values()), ""))

    def one(path: str) -> None:
        target = f"{prefix}{path}"
        if server_side:
            s3.copy_within_s3(
                access.client, source_bucket=storage.bucket, source_key=keys[path], bucket=bucket, key=target
            )
        else:
            _stream(storage, keys[path], access.client, bucket, target)

    with ThreadPoolExecutor(min(COPY_THREADS, max(len(files), 1))) as pool:
        for _ in pool.map(one, [f.path for f in files]):
            pass
    return Copied(len(files), sum(f.size for f in files), "server-side" if server_side else "streamed")


def _within_s3(storage: Storage, client: Any, source: str, key: str) -> bool:
    """Whether a server-side copy can work: the artifact is in an S3 bucket
    of AWS, and the destination's credentials (an AWS account's, not
    another endpoint's) may read it."""
    if not isinstance(storage, S3Storage) or not source.startswith("aws:") or not key:
        return False
    return s3.readable(client, bucket=storage.bucket, key=key)


def _stream(storage: Storage, key: str, client: Any, bucket: str, target: str) -> None:
    source = storage.open(key)
    try:
        s3.upload_to(client, bucket=bucket, key=target, source=source)
    finally:
        source.close()


def _failed(export: ArtifactExport, *, claimed_at: datetime, reason: str) -> str:
    with transaction.atomic():
        mine = (
            ArtifactExport.objects.select_for_update()
            .filter(pk=export.pk, status=ExportStatus.COPYING, claimed_at=claimed_at)
            .first()
        )
        if mine is None:
            return "superseded"
        return _after_failure(mine, claimed_at=claimed_at, reason=reason, now=timezone.now())


def _after_failure(export: ArtifactExport, *, claimed_at: datetime | None, reason: str, now: datetime) -> str:
    """copying → pending (its next attempt due after ``retry_wait``) or, the
    attempts spent, failed; either keeps ``reason``."""
    last = export.attempts >= settings.TRAINYARD["EXPORT_ATTEMPTS"]
    fields: dict[str, object] = {"error": reason[:ERROR_CHARS], "claimed_at": None}
    if last:
        fields.update(status=ExportStatus.FAILED, next_attempt_at=None)
    else:
        fields.update(status=ExportStatus.PENDING, next_attempt_at=now + timedelta(seconds=retry_wait(export.attempts)))
    ArtifactExport.objects.filter(pk=export.pk, status=ExportStatus.COPYING, claimed_at=claimed_at).update(**fields)
    return f"failed: {reason}" if last else f"will retry: {reason}"


def _reason(error: Exception) -> str:
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        operation = getattr(error, "operation_name", "")
        return f"S3 refused {operation}: {info.get('Code', '')} {info.get('Message', '')}".strip()
    if isinstance(error, (BotoCoreError, ApplicationError)):
        return str(error)
    return f"{type(error).__name__}: {error}"

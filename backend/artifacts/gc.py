"""Storage garbage collection (Celery beat: ``storage-gc``, every
TRAINYARD_GC_EVERY_SECONDS; docs/STORAGE.md, "Garbage collection").

What goes, and only once it is older than TRAINYARD_GC_GRACE_SECONDS:

1. Code blobs no run points at (a ``trainyard run`` whose run was never
   created). A blob a run names is never touched (the foreign key is
   PROTECT too).
2. Unfinished uploads (an artifact, checkpoint version or cache saving still
   ``uploading``) of a job that has finished: its attempt can never complete
   them. Their own objects go with them, never one another row points at.
   A complete artifact or checkpoint version is never deleted here, so a
   trained model is never lost because an upload hiccupped.
2b. Cache savings replaced by a newer one once every restore URL that names
   them has expired (``caches.caches_replaced_delete``; no grace beyond that).
3. Local storage only: temporary files of PUTs and blob uploads that never
   finished (``.upload-*``), and files under ``workspaces/`` that no row
   points at (the rows went, deleting their objects failed). The files are
   listed first and the rows read after, so an object whose row appears
   while the pass runs is always seen as referenced.

Objects of an S3 bucket that no row points at are not listed here: the
bucket's lifecycle rule aborts unfinished multipart uploads (docs/STORAGE.md).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from backend.artifacts.caches import caches_replaced_delete
from backend.artifacts.locations import storage_of
from backend.artifacts.models import Artifact, ArtifactFile, ArtifactStatus, Blob
from backend.artifacts.services import artifact_file_key, artifacts_discard
from backend.artifacts.storage import LocalStorage, get_storage
from backend.runs.models import FINISHED_JOB, EnvironmentArchive, LogArchive, Run

log = logging.getLogger(__name__)

TEMP_PREFIX = ".upload-"
BATCH = 500


@dataclass(frozen=True)
class GcReport:
    blobs: int
    uploads: int
    temp_files: int
    orphan_files: int


def storage_gc(*, grace_seconds: float) -> GcReport:
    """One garbage collection pass (the steps of the module docstring)."""
    cutoff = timezone.now() - timedelta(seconds=grace_seconds)
    blobs = _unreferenced_blobs(cutoff)
    uploads = _abandoned_uploads(cutoff)
    caches_replaced_delete(now=timezone.now())
    local = get_storage()
    temp, orphans = _local_files(local, time.time() - grace_seconds)
    report = GcReport(blobs=blobs, uploads=uploads, temp_files=temp, orphan_files=orphans)
    if any((blobs, uploads, temp, orphans)):
        log.info("storage gc: %s", report)
    return report


def _unreferenced_blobs(cutoff: object) -> int:
    # Each subquery without NULLs: "NOT IN (…, NULL)" would exclude every row.
    patches = Run.objects.filter(patch_blob_id__isnull=False).values("patch_blob_id")
    archives = Run.objects.filter(archive_blob_id__isnull=False).values("archive_blob_id")
    referenced = Q(pk__in=patches) | Q(pk__in=archives)
    deleted = 0
    for blob in Blob.objects.filter(created_at__lt=cutoff).exclude(referenced)[:BATCH]:
        with transaction.atomic():
            # Locked and checked again: a run created since the query may name it.
            row = Blob.objects.select_for_update().filter(pk=blob.pk).first()
            if row is None or Run.objects.filter(Q(patch_blob=row) | Q(archive_blob=row)).exists():
                continue
            storage, key = storage_of(row), row.storage_key
            row.delete()
            transaction.on_commit(partial(storage.delete, [key]))
        deleted += 1
    return deleted


def _abandoned_uploads(cutoff: object) -> int:
    stale = Artifact.stored.filter(
        status=ArtifactStatus.UPLOADING, updated_at__lt=cutoff, job__status__in=FINISHED_JOB
    ).values_list("pk", flat=True)[:BATCH]
    with transaction.atomic():
        return artifacts_discard(
            Artifact.stored.select_for_update().filter(pk__in=list(stale), status=ArtifactStatus.UPLOADING)
        )


def _local_files(storage: LocalStorage, cutoff: float) -> tuple[int, int]:
    """(temporary files removed, unreferenced files removed) under the local storage."""
    root = storage.root / "workspaces"
    if not root.is_dir():
        return 0, 0
    temp: list[Path] = []
    old: list[Path] = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            try:
                if path.stat().st_mtime >= cutoff:
                    continue
            except FileNotFoundError:
                continue
            (temp if name.startswith(TEMP_PREFIX) else old).append(path)
    for path in temp:
        path.unlink(missing_ok=True)
    referenced = _local_keys()  # read after listing: see the module docstring
    orphans = [p for p in old if p.relative_to(storage.root).as_posix() not in referenced]
    for path in orphans:
        path.unlink(missing_ok=True)
        log.info("storage gc: removed %s (no row points at it)", path)
    return len(temp), len(orphans)


def _local_keys() -> set[str]:
    """Every key of the local storage a row points at: blobs, every file of
    every artifact, checkpoint version and cache saving (finished or not),
    every job's archived log and every packed environment."""
    keys = set(Blob.objects.filter(storage_bucket="").values_list("storage_key", flat=True))
    files = (
        ArtifactFile.objects.filter(artifact__storage_bucket="")
        .select_related("artifact")
        .only("path", "key", "artifact__storage_prefix")
    )
    keys.update(artifact_file_key(f.artifact, f) for f in files.iterator(chunk_size=2000))
    keys.update(LogArchive.objects.filter(storage_bucket="").values_list("key", flat=True))
    keys.update(EnvironmentArchive.objects.filter(storage_bucket="").values_list("storage_key", flat=True))
    return keys

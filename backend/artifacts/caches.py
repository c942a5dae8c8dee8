"""A workflow's ``cache:`` paths (dstack 0.x): restored before the commands,
saved after them, per workspace, code scope (the run's repository:
``Run.code_scope``) and workflow (docs/STORAGE.md, "Caches"): a member's run
of one repository never writes what another repository's jobs restore.

A saving is an ``Artifact`` of kind cache with ``cache_key``
"<code scope>\\n<workflow>\\n<path>", belonging to the job that saved it
(its run names the member who submitted it). It goes up like
a checkpoint version (``cache_begin``, then the artifact endpoints): a file
unchanged since the key's latest saving (same path, size, sha256, storage)
is not uploaded again, its row points at the object that holds it. On
complete (``cache_complete``) every file is verified and the saving becomes
the key's latest: the next job of the workflow and code scope in the
workspace gets it in its ``AssignJob``. A replaced saving stays until every
restore URL that names it has expired (``DOWNLOAD_URL_SECONDS`` after it
was replaced, the last moment one was signed for it), so a job restoring it
meanwhile does not fail halfway; then the storage gc
(``caches_replaced_delete``) deletes it with the objects no other saving of
the key points at.
"""

from __future__ import annotations

import logging
import math
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from trainyard_runner import protocol

from backend.artifacts.checkpoints import DOWNLOAD_URL_SECONDS, Begun, file_rows
from backend.artifacts.locations import location_of, storage_for_new, storage_of
from backend.artifacts.models import Artifact, ArtifactFile, ArtifactKind, ArtifactStatus
from backend.artifacts.quota import charged, quota_check
from backend.artifacts.services import (
    UPLOAD_URL_SECONDS,
    FileIn,
    Upload,
    artifact_complete,
    artifact_file_key,
    artifacts_discard,
    part_size,
)
from backend.core.errors import ApplicationError, NotFound
from backend.runs.models import Job

log = logging.getLogger(__name__)


def cache_key(job: Job, path: str) -> str:
    return f"{job.run.code_scope}\n{job.workflow}\n{path}"


def cache_latest(*, job: Job, path: str) -> Artifact | None:
    """The workspace's latest complete saving of ``path`` for the job's workflow and code scope."""
    return (
        Artifact.stored.filter(
            workspace_id=job.workspace_id,
            kind=ArtifactKind.CACHE,
            cache_key=cache_key(job, path),
            status=ArtifactStatus.COMPLETE,
        )
        .order_by("-completed_at")
        .first()
    )


def cache_specs(*, job: Job) -> list[protocol.CacheSpec]:
    """The AssignJob's caches: each ``cache:`` path with its latest saving's
    files and signed URLs (none yet: an empty list of files)."""
    specs = []
    for path in job.spec.get("cache") or []:
        latest = cache_latest(job=job, path=path)
        files = []
        if latest is not None:
            storage = storage_of(latest)
            files = [
                protocol.InputFile(
                    path=f.path,
                    size=f.size,
                    sha256=f.sha256,
                    url=storage.signed_url(artifact_file_key(latest, f), method="GET", seconds=DOWNLOAD_URL_SECONDS),
                )
                for f in latest.files.order_by("path")
            ]
        specs.append(protocol.CacheSpec(path=path, files=files))
    return specs


def cache_file_url(*, job: Job, path: str, file_path: str) -> str:
    """A fresh URL for one file of the latest saving of ``path`` (the runner asks when one expired)."""
    latest = cache_latest(job=job, path=path)
    file = latest.files.filter(path=file_path).first() if latest is not None else None
    if latest is None or file is None:
        raise NotFound(f"The cache {path!r} of this workflow has no file {file_path!r}.")
    return storage_of(latest).signed_url(artifact_file_key(latest, file), method="GET", seconds=DOWNLOAD_URL_SECONDS)


def cache_begin(*, job: Job, attempt: int, path: str, files: list[FileIn]) -> Begun:
    """A new saving of ``path``: record the manifest and say how each file
    that changed since the latest saving goes up."""
    if path not in (job.spec.get("cache") or []):
        raise ApplicationError(f"{path!r} is not a cache: path of this job ({job.spec.get('cache') or []}).")
    storage = storage_for_new(workspace_id=job.workspace_id)
    base = cache_latest(job=job, path=path)
    same_place = base is not None and (base.storage_account_id, base.storage_bucket) == (
        storage.account_id,
        storage.bucket,
    )
    known = {f.path: f for f in base.files.all()} if base is not None and same_place else {}
    carried = {
        f.path: known[f.path]
        for f in files
        if f.path in known and (known[f.path].size, known[f.path].sha256) == (f.size, f.sha256)
    }
    threshold = settings.TRAINYARD["MULTIPART_THRESHOLD"]
    parts = {f.path: part_size(f.size) if storage.multipart and f.size > threshold else 0 for f in files}
    root = storage.key_root(job.workspace_id)
    with transaction.atomic():
        # An unfinished saving of the same path by this job (a retry) gives way, with its files.
        artifacts_discard(
            Artifact.stored.filter(job=job, kind=ArtifactKind.CACHE, path=path, status=ArtifactStatus.UPLOADING)
        )
        quota_check(
            workspace_id=job.workspace_id,
            requested=charged(f.size for f in files if f.path not in carried) if files else charged([0]),
        )
        saving: Artifact = Artifact.stored.create(
            workspace_id=job.workspace_id,
            run_id=job.run_id,
            job=job,
            path=path,
            kind=ArtifactKind.CACHE,
            attempt=attempt,
            cache_key=cache_key(job, path),
            base=base if same_place else None,
            storage_prefix=f"{root}/runs/{job.run_id}/jobs/{job.pk}/caches/{uuid.uuid4()}",
            total_size=sum(f.size for f in files),
            **location_of(storage),
        )
        ArtifactFile.objects.bulk_create(file_rows(saving, files, base, carried, parts))
    uploads = []
    for f in files:
        if f.path in carried:
            continue
        if parts[f.path]:
            uploads.append(Upload(f.path, "", {}, parts[f.path], math.ceil(f.size / parts[f.path])))
        else:
            target = storage.upload_target(
                f"{saving.storage_prefix}/{f.path}", sha256=f.sha256, size=f.size, seconds=UPLOAD_URL_SECONDS
            )
            uploads.append(Upload(f.path, target.url, target.headers))
    return Begun(saving, uploads, len(files) - len(uploads))


def cache_complete(*, saving: Artifact) -> Artifact:
    """Verify every file; the saving is then the key's latest. The savings it
    replaces are deleted later (``caches_replaced_delete``)."""
    if saving.status != ArtifactStatus.COMPLETE:
        saving = artifact_complete(artifact=saving)
    log.info("job %s: cache %s saved (%d files)", saving.job_id, saving.path, saving.files.count())
    return saving


def caches_replaced_delete(*, now: datetime, limit: int = 500) -> int:
    """Delete the cache savings a newer complete saving of their key replaced
    more than ``DOWNLOAD_URL_SECONDS`` ago (every URL signed for them has
    expired), with their objects that no remaining saving of the key points
    at (a later saving carries unchanged files by pointing at them). Returns
    how many savings went."""
    cutoff = now - timedelta(seconds=DOWNLOAD_URL_SECONDS)
    replaced_before_cutoff = Artifact.stored.filter(
        workspace_id=OuterRef("workspace_id"),
        kind=ArtifactKind.CACHE,
        cache_key=OuterRef("cache_key"),
        status=ArtifactStatus.COMPLETE,
        completed_at__gt=OuterRef("completed_at"),
        completed_at__lt=cutoff,
    )
    old = list(
        Artifact.stored.filter(kind=ArtifactKind.CACHE, status=ArtifactStatus.COMPLETE)
        .filter(Exists(replaced_before_cutoff))
        .prefetch_related("files")[:limit]
    )
    for saving in old:
        _saving_delete(saving)
    return len(old)


def _saving_delete(saving: Artifact) -> None:
    with transaction.atomic():
        siblings = Artifact.stored.filter(
            workspace_id=saving.workspace_id, kind=ArtifactKind.CACHE, cache_key=saving.cache_key
        ).exclude(pk=saving.pk)
        Artifact.stored.filter(base=saving).update(base=None)
        in_use = {artifact_file_key(a, f) for a in siblings.prefetch_related("files") for f in a.files.all()}
        Artifact.stored.filter(pk=saving.pk).delete()
    keys = [k for f in saving.files.all() if (k := artifact_file_key(saving, f)) not in in_use]
    try:
        storage_of(saving).delete(keys)
    except Exception:  # the row is gone; an object left behind only costs storage (the gc finds local ones)
        log.exception("cache %r: deleting the objects of a replaced saving failed", saving.path)

"""Versioned checkpoints of a job (docs/decisions/0030-checkpoint-versions.md).

Every sync by the runner is a new version: an ``Artifact`` of kind
checkpoint, number n of the job, under
``…/runs/<run>/jobs/<job>/checkpoints/<attempt>/<n>/``. It goes up like an
artifact (``checkpoint_begin``, then the artifact endpoints for URLs and
parts) except that a file unchanged since the latest version (same path,
size and sha256, same storage) is not uploaded again: the new version's row
points at the object that already holds it. ``checkpoint_complete``
verifies every file of the version (the carried ones too) and only then
moves the job's one ``CheckpointLatest`` pointer by a compare-and-set on the
version it was based on; a version left half-way is never latest, so never
restored. Versions beyond ``CHECKPOINT_KEEP`` are pruned, and so are their
objects no kept version points at.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max
from trainyard_runner import protocol

from backend.artifacts.locations import location_of, storage_for_new, storage_of
from backend.artifacts.models import Artifact, ArtifactFile, ArtifactKind, ArtifactStatus, CheckpointLatest
from backend.artifacts.quota import charged, quota_check
from backend.artifacts.services import (
    UPLOAD_URL_SECONDS,
    FileIn,
    Upload,
    _check_relative,
    artifact_complete,
    artifact_file_key,
    part_size,
)
from backend.artifacts.storage import Storage
from backend.core.errors import ApplicationError, NotFound
from backend.runs.models import Job

log = logging.getLogger(__name__)

DOWNLOAD_URL_SECONDS = 900


@dataclass(frozen=True)
class Begun:
    version: Artifact
    uploads: list[Upload]
    carried: int  # files not uploaded again: unchanged since the base version


def checkpoint_latest(*, job: Job) -> Artifact | None:
    """The job's latest complete checkpoint version (any attempt), or None."""
    pointer = CheckpointLatest.objects.filter(job=job).select_related("version").first()
    return pointer.version if pointer is not None else None


def checkpoint_begin(*, job: Job, attempt: int, path: str, files: list[FileIn]) -> Begun:
    """Start version n+1 of ``job``'s checkpoint for its attempt ``attempt``
    (the current one, or one winding down after a notice): record the
    manifest and say how each changed file goes up."""
    if path != (job.spec.get("checkpoint") or ""):
        raise ApplicationError(f"{path!r} is not this job's checkpoint path ({job.spec.get('checkpoint')!r}).")
    for f in files:
        _check_relative(f.path)
    storage = storage_for_new(workspace_id=job.workspace_id)
    base = checkpoint_latest(job=job)
    same_place = base is not None and (base.storage_account_id, base.storage_bucket) == (
        storage.account_id,
        storage.bucket,
    )
    known = {f.path: f for f in base.files.all()} if base is not None and same_place else {}
    threshold = settings.TRAINYARD["MULTIPART_THRESHOLD"]
    carried: dict[str, ArtifactFile] = {}
    for f in files:
        old = known.get(f.path)
        if base is not None and old is not None and (old.size, old.sha256) == (f.size, f.sha256):
            carried[f.path] = old
    parts = {f.path: part_size(f.size) if storage.multipart and f.size > threshold else 0 for f in files}
    version = _create_version(job, attempt, path, files, base, storage, carried, parts)
    uploads = []
    for f in files:
        if f.path in carried:
            continue
        if parts[f.path]:
            uploads.append(Upload(f.path, "", {}, parts[f.path], math.ceil(f.size / parts[f.path])))
        else:
            key = f"{version.storage_prefix}/{f.path}"
            target = storage.upload_target(key, sha256=f.sha256, size=f.size, seconds=UPLOAD_URL_SECONDS)
            uploads.append(Upload(f.path, target.url, target.headers))
    return Begun(version, uploads, len(files) - len(uploads))


def _create_version(
    job: Job,
    attempt: int,
    path: str,
    files: list[FileIn],
    base: Artifact | None,
    storage: Storage,
    carried: dict[str, ArtifactFile],
    parts: dict[str, int],
) -> Artifact:
    """The version's row and its files' rows, in one transaction, as number
    n+1 of the job (two syncs racing for a number: the loser takes the next)."""
    for _ in range(3):
        last = Artifact.stored.filter(job=job, kind=ArtifactKind.CHECKPOINT).aggregate(n=Max("number"))["n"]
        number = (last or 0) + 1
        root = storage.key_root(job.workspace_id)
        prefix = f"{root}/runs/{job.run_id}/jobs/{job.pk}/checkpoints/{attempt}/{number}"
        try:
            with transaction.atomic():
                # Only the files not carried from the base version take room.
                new_bytes = charged(f.size for f in files if f.path not in carried)
                quota_check(workspace_id=job.workspace_id, requested=new_bytes)
                version: Artifact = Artifact.stored.create(
                    workspace_id=job.workspace_id,
                    run_id=job.run_id,
                    job=job,
                    path=path,
                    kind=ArtifactKind.CHECKPOINT,
                    attempt=attempt,
                    number=number,
                    base=base,
                    storage_prefix=prefix,
                    total_size=sum(f.size for f in files),
                    **location_of(storage),
                )
                ArtifactFile.objects.bulk_create(file_rows(version, files, base, carried, parts))
                return version
        except IntegrityError:
            continue
    raise ApplicationError(
        "Another checkpoint sync of this job is starting at the same time: try again.", status_code=409
    )


def file_rows(
    version: Artifact,
    files: list[FileIn],
    base: Artifact | None,
    carried: dict[str, ArtifactFile],
    parts: dict[str, int],
) -> list[ArtifactFile]:
    """The file rows of a new version: a file ``carried`` from ``base`` points
    at the object that already holds it; the others are uploaded (in
    ``parts[path]``-byte parts, 0: whole). Checkpoints and caches."""
    rows = []
    for f in files:
        old = carried.get(f.path)
        if base is not None and old is not None:
            rows.append(ArtifactFile(artifact=version, path=f.path, size=f.size, sha256=f.sha256,
                                     key=artifact_file_key(base, old), part_size=old.part_size,
                                     part_sha256s=old.part_sha256s))  # fmt: skip
        else:
            rows.append(ArtifactFile(artifact=version, path=f.path, size=f.size, sha256=f.sha256,
                                     part_size=parts[f.path]))  # fmt: skip
    return rows


def checkpoint_complete(*, version: Artifact) -> Artifact:
    """Verify every file of ``version``, then make it the latest by one
    compare-and-set on the version it was based on; prune old versions."""
    if version.status == ArtifactStatus.COMPLETE:  # a retried request: the answer it did not get
        if CheckpointLatest.objects.filter(job_id=version.job_id, version=version).exists():
            return version
        raise ApplicationError(f"checkpoint {version.number} is complete but not the latest.", status_code=409)
    version = artifact_complete(artifact=version)
    with transaction.atomic():
        if version.base_id is None:
            _, moved = CheckpointLatest.objects.get_or_create(job_id=version.job_id, defaults={"version": version})
        else:
            moved = bool(
                CheckpointLatest.objects.filter(job_id=version.job_id, version_id=version.base_id).update(
                    version=version
                )
            )
    if not moved:
        raise ApplicationError(
            f"checkpoint {version.number} was based on a version that is no longer the latest: "
            "it is kept but not made latest.",
            status_code=409,
        )
    log.info("job %s: checkpoint %d is the latest", version.job_id, version.number)
    try:
        checkpoint_prune(job_id=str(version.job_id), keep=settings.TRAINYARD["CHECKPOINT_KEEP"])
    except Exception:  # the version is the latest either way; the next sync prunes again
        log.exception("job %s: pruning old checkpoint versions failed", version.job_id)
    return version


def checkpoint_prune(*, job_id: str, keep: int) -> int:
    """Delete all but the ``keep`` newest complete versions (the latest is
    always kept) and unfinished versions older than the latest; delete the
    objects that no kept version's file points at. Returns versions deleted."""
    pointer = CheckpointLatest.objects.filter(job_id=job_id).first()
    if pointer is None:
        return 0
    versions = list(Artifact.stored.filter(job_id=job_id, kind=ArtifactKind.CHECKPOINT).order_by("-number"))
    latest = next(v for v in versions if v.pk == pointer.version_id)
    complete = [v for v in versions if v.status == ArtifactStatus.COMPLETE and v.number <= latest.number]
    kept_ids = {latest.pk, *(v.pk for v in complete[: max(keep, 1)])}
    kept_ids |= {v.pk for v in versions if v.number > latest.number}  # a sync under way
    doomed = [v for v in versions if v.pk not in kept_ids]
    if not doomed:
        return 0
    in_use = {
        artifact_file_key(f.artifact, f)
        for f in ArtifactFile.objects.filter(artifact_id__in=kept_ids).select_related("artifact")
    }
    for version in doomed:
        storage = storage_of(version)
        files = list(version.files.all())
        for f in files:
            if f.upload_id and not f.part_sha256s:
                storage.multipart_abort(artifact_file_key(version, f), upload_id=f.upload_id)
        storage.delete([k for f in files if (k := artifact_file_key(version, f)) not in in_use])
        Artifact.stored.filter(base=version).update(base=None)
        version.delete()
    log.info("job %s: pruned %d checkpoint version(s)", job_id, len(doomed))
    return len(doomed)


def checkpoint_spec(*, job: Job) -> protocol.CheckpointSpec | None:
    """The AssignJob's checkpoint: the path, how often to sync, and the
    latest version with signed URLs for its files (an attempt after the
    first restores it before its commands start)."""
    path = job.spec.get("checkpoint") or ""
    if not path:
        return None
    latest = checkpoint_latest(job=job)
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
    return protocol.CheckpointSpec(
        path=path,
        sync_seconds=settings.TRAINYARD["CHECKPOINT_SYNC_SECONDS"],
        version=latest.number if latest is not None else 0,
        files=files,
    )


def checkpoint_file_url(*, job: Job, number: int, file_path: str) -> str:
    """A fresh URL for one file of version ``number`` (the runner asks when one expired)."""
    version = Artifact.stored.filter(
        job=job, kind=ArtifactKind.CHECKPOINT, number=number, status=ArtifactStatus.COMPLETE
    ).first()
    file = version.files.filter(path=file_path).first() if version is not None else None
    if version is None or file is None:
        raise NotFound(f"Checkpoint {number} of this job has no file {file_path!r}.")
    return storage_of(version).signed_url(artifact_file_key(version, file), method="GET", seconds=DOWNLOAD_URL_SECONDS)

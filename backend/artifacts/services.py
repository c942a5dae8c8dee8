"""Writes for stored bytes: code blobs and job artifacts.

An artifact is uploaded by its runner in three steps (docs/API.md, "Runner
endpoints"): ``artifact_begin`` records the manifest and hands out a target
per file (a PUT URL, or for a large file on S3 a part size: the file goes up
in parts); ``artifact_upload_targets`` hands out fresh URLs on demand (a URL
expired, the next batch of parts) and ``artifact_parts_complete`` assembles a
file from its parts; ``artifact_complete`` checks every file against the
manifest without reading the bytes back from S3
(docs/decisions/0073-s3-upload-verification.md).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from backend.accounts.models import User, Workspace
from backend.artifacts.exports import export_begin
from backend.artifacts.locations import location_of, storage_for_new, storage_of
from backend.artifacts.models import Artifact, ArtifactFile, ArtifactKind, ArtifactStatus, Blob
from backend.artifacts.quota import Usage, charged, over_quota, quota_check, storage_usage
from backend.artifacts.storage import Part, Storage, Target, delete_after_commit
from backend.core.errors import ApplicationError, NotFound
from backend.runs.models import Job

# Local storage signs URLs that outlive the whole upload; S3 caps every URL at
# 15 minutes (settings.TRAINYARD["S3_URL_SECONDS"]) and the runner asks again.
logger = logging.getLogger(__name__)

UPLOAD_URL_SECONDS = 6 * 3600
# Objects of one artifact checked at once when it completes (S3: one HEAD each).
VERIFY_THREADS = 10  # botocore keeps 10 connections per client
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
MAX_PARTS = 10_000  # S3's maximum
MAX_PARTS_PER_CALL = 100
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class FileIn:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Upload:
    """How one file goes up: PUT to ``url`` with ``headers``, or (``part_size``
    > 0) in ``parts`` parts whose URLs come from ``artifact_upload_targets``."""

    path: str
    url: str
    headers: dict[str, str]
    part_size: int = 0
    parts: int = 0


def blob_create(*, workspace: Workspace, user: User, chunks: Iterator[bytes], declared: int | None = None) -> Blob:
    """Stream an upload into storage, hashing as it goes; enforce the size
    cap and the workspace's storage quota (``declared``: the request's
    Content-Length, checked before a byte is read)."""
    blob_id = uuid.uuid4()
    storage = storage_for_new(workspace_id=workspace.pk)
    key = f"{storage.key_root(workspace.pk)}/blobs/{blob_id}"
    digest = hashlib.sha256()
    limit = settings.TRAINYARD["MAX_BLOB_BYTES"]
    usage = storage_usage(workspace_id=workspace.pk)
    room = usage.quota - usage.used if usage.quota else None
    if declared is not None:
        _blob_fits(declared, limit, usage, room)
    seen = 0

    def hashed() -> Iterator[bytes]:
        nonlocal seen
        for chunk in chunks:
            seen += len(chunk)
            _blob_fits(seen, limit, usage, room)
            digest.update(chunk)
            yield chunk

    size = storage.write(key, hashed())
    try:
        with transaction.atomic():
            quota_check(workspace_id=workspace.pk, requested=charged([size]))  # another upload may have taken the room
            return Blob.objects.create(
                id=blob_id,
                workspace=workspace,
                size=size,
                sha256=digest.hexdigest(),
                storage_key=key,
                created_by=user,
                **location_of(storage),
            )
    except ApplicationError:
        storage.delete([key])
        raise


def _blob_fits(size: int, limit: int, usage: Usage, room: int | None) -> None:
    if size > limit:
        raise ApplicationError(
            f"The upload is larger than TRAINYARD_MAX_BLOB_BYTES ({limit} bytes): "
            "list large files in .trainyardignore (or .gitignore), or commit and push them.",
            status_code=413,
        )
    if room is not None and size > room:
        raise over_quota(usage, size)


def artifact_begin(*, job: Job, path: str, files: list[FileIn]) -> tuple[Artifact, list[Upload]]:
    """Record an artifact's manifest in the workspace's storage and say how
    each file goes up: a signed PUT, or in parts (large files on S3)."""
    for f in files:
        _check_relative(f.path)
    storage = storage_for_new(workspace_id=job.workspace_id)
    prefix = f"{storage.key_root(job.workspace_id)}/runs/{job.run_id}/jobs/{job.pk}/artifacts/{uuid.uuid4()}"
    threshold = settings.TRAINYARD["MULTIPART_THRESHOLD"]
    part_sizes = {f.path: part_size(f.size) if storage.multipart and f.size > threshold else 0 for f in files}
    with transaction.atomic():
        # A retried upload (runner reconnected) replaces the unfinished one,
        # whose files and multipart uploads go once this is committed. A
        # complete one stays until this one is complete (``artifact_complete``):
        # a failed upload loses nothing.
        artifacts_discard(Artifact.objects.filter(job=job, path=path, status=ArtifactStatus.UPLOADING))
        quota_check(workspace_id=job.workspace_id, requested=charged(f.size for f in files) if files else charged([0]))
        artifact = Artifact.objects.create(
            workspace_id=job.workspace_id,
            run_id=job.run_id,
            job=job,
            path=path,
            storage_prefix=prefix,
            total_size=sum(f.size for f in files),
            **location_of(storage),
        )
        ArtifactFile.objects.bulk_create(
            ArtifactFile(artifact=artifact, path=f.path, size=f.size, sha256=f.sha256, part_size=part_sizes[f.path])
            for f in files
        )
    uploads = []
    for f in files:
        if part_sizes[f.path]:
            uploads.append(Upload(f.path, "", {}, part_sizes[f.path], math.ceil(f.size / part_sizes[f.path])))
        else:
            # Local storage: every URL outlives the whole upload. S3: 15 minutes, then the runner asks again.
            target = storage.upload_target(
                f"{prefix}/{f.path}", sha256=f.sha256, size=f.size, seconds=UPLOAD_URL_SECONDS
            )
            uploads.append(Upload(f.path, target.url, target.headers))
    return artifact, uploads


def artifacts_discard(artifacts: models.QuerySet[Artifact]) -> int:
    """Delete the rows of ``artifacts`` (unfinished uploads: a retried begin,
    the garbage collector) and, once that is committed, their own objects and
    unfinished multipart uploads. Never an object another row points at (a
    checkpoint or cache file carried into a kept version). Returns rows deleted."""
    doomed = list(artifacts.prefetch_related("files"))
    if not doomed:
        return 0
    ids = [a.pk for a in doomed]
    own = {a.pk: [(f, f"{a.storage_prefix}/{f.path}") for f in a.files.all() if not f.key] for a in doomed}
    keys = [k for pairs in own.values() for _, k in pairs]
    shared = set(ArtifactFile.objects.filter(key__in=keys).exclude(artifact_id__in=ids).values_list("key", flat=True))
    plans = [(a, [(f, k) for f, k in own[a.pk] if k not in shared]) for a in doomed]
    Artifact.stored.filter(base_id__in=ids).update(base=None)
    Artifact.stored.filter(pk__in=ids).delete()

    def delete_objects() -> None:
        for artifact, files in plans:
            try:
                storage = storage_of(artifact)
                for f, key in files:
                    if f.upload_id and not f.part_sha256s:
                        storage.multipart_abort(key, upload_id=f.upload_id)
                storage.delete([key for _, key in files])
            except Exception:  # the rows are gone; the garbage collector finds what is left
                logger.exception("artifact %s: deleting the objects of an abandoned upload failed", artifact.pk)

    transaction.on_commit(delete_objects)
    return len(doomed)


def artifact_upload_targets(*, artifact: Artifact, path: str, parts: list[tuple[int, str]]) -> list[Target]:
    """Fresh upload URLs for one file of an unfinished artifact: the whole
    file (``parts`` empty), or the given (number, sha256) parts of a file
    uploaded in parts. The first call for a part creates the multipart upload."""
    file = _unfinished_file(artifact, path)
    storage = storage_of(artifact)
    key = artifact_file_key(artifact, file)
    if not file.part_size:
        if parts:
            raise ApplicationError(f"{path} is uploaded whole, not in parts.")
        return [storage.upload_target(key, sha256=file.sha256, size=file.size, seconds=UPLOAD_URL_SECONDS)]
    _check_parts(file, [n for n, _ in parts], complete=False)
    for _, sha in parts:
        if not _SHA256.match(sha):
            raise ApplicationError(f"part sha256 {sha!r} of {path} is not 64 lowercase hex digits.")
    # Each part's URL is bound to its size: part_size, the last one the rest.
    sized = [(n, sha, min(file.part_size, file.size - (n - 1) * file.part_size)) for n, sha in parts]
    return storage.part_targets(key, upload_id=_upload_id(storage, key, file), parts=sized)


def artifact_parts_complete(*, artifact: Artifact, path: str, parts: list[Part]) -> None:
    """Assemble a file uploaded in parts; every part 1..N must be named once."""
    file = _unfinished_file(artifact, path)
    if not file.part_size or not file.upload_id:
        raise ApplicationError(f"{path} has no upload in parts under way: ask for part URLs first.")
    ordered = sorted(parts, key=lambda p: p.number)
    _check_parts(file, [p.number for p in ordered], complete=True)
    storage_of(artifact).multipart_complete(artifact_file_key(artifact, file), upload_id=file.upload_id, parts=ordered)
    ArtifactFile.objects.filter(pk=file.pk).update(part_sha256s=[p.sha256 for p in ordered])


def artifact_complete(*, artifact: Artifact) -> Artifact:
    """Check that every file arrived whole before the artifact counts."""
    storage = storage_of(artifact)
    problems = {}
    files = list(artifact.files.all())
    for f in files:
        if f.part_size and not f.part_sha256s:
            problems[f.path] = "its parts were not completed"

    def check(f: ArtifactFile) -> str:
        key = artifact_file_key(artifact, f)
        return storage.verify(key, size=f.size, sha256=f.sha256, part_sha256s=f.part_sha256s if f.part_size else [])

    # One HEAD per object on S3, VERIFY_THREADS at a time: a checkpoint of many
    # small files is verified in parallel (bench/results/2026-12-01-spot.md).
    checked = [f for f in files if f.path not in problems]
    with ThreadPoolExecutor(min(VERIFY_THREADS, max(len(checked), 1))) as pool:
        for f, problem in zip(checked, pool.map(check, checked), strict=True):
            if problem:
                problems[f.path] = problem
    if problems:
        first, why = next(iter(problems.items()))
        raise ApplicationError(
            f"{len(problems)} file(s) of {artifact.path} are missing or differ from the manifest "
            f"({first}: {why}): upload them again.",
            extra={"files": list(problems)[:50]},
        )
    with transaction.atomic():
        if artifact.kind == ArtifactKind.OUTPUT:
            _replace_older(artifact)
        Artifact.stored.filter(pk=artifact.pk).update(status=ArtifactStatus.COMPLETE, completed_at=timezone.now())
        artifact.refresh_from_db()
        if artifact.kind == ArtifactKind.OUTPUT:
            export_begin(job=artifact.job, artifact=artifact)
    return artifact


def _replace_older(artifact: Artifact) -> None:
    """The job's earlier uploads of the same path (a mounted artifact's last
    live upload, an upload of an earlier attempt) give way to ``artifact``:
    their rows go now, their objects once that is committed."""
    older = list(
        Artifact.objects.filter(job_id=artifact.job_id, path=artifact.path, created_at__lt=artifact.created_at)
        .exclude(pk=artifact.pk)
        .prefetch_related("files")
    )
    if not older:
        return
    doomed = [(storage_of(a), [artifact_file_key(a, f) for f in a.files.all()]) for a in older]
    Artifact.objects.filter(pk__in=[a.pk for a in older]).delete()
    for storage, keys in doomed:
        delete_after_commit(storage, keys, f"the earlier upload of {artifact.path}")


def part_size(size: int) -> int:
    """The part size for a file of ``size`` bytes: the configured one, larger
    if the file would need more than S3's 10,000 parts (whole MiB)."""
    wanted = max(settings.TRAINYARD["MULTIPART_PART_SIZE"], MIN_PART_SIZE, math.ceil(size / MAX_PARTS))
    return math.ceil(wanted / (1 << 20)) << 20


def artifact_file_key(artifact: Artifact, file: ArtifactFile) -> str:
    """Where the file's bytes are: under the artifact's prefix, or (a
    checkpoint file carried from an earlier version) the object it names."""
    return file.key or f"{artifact.storage_prefix}/{file.path}"


def _unfinished_file(artifact: Artifact, path: str) -> ArtifactFile:
    if artifact.status != ArtifactStatus.UPLOADING:
        raise ApplicationError(f"{artifact.path} is complete: nothing more to upload.", status_code=409)
    file = artifact.files.filter(path=path).first()
    if file is None:
        raise NotFound(f"{path!r} is not a file of {artifact.path}.")
    return file


def _check_parts(file: ArtifactFile, numbers: list[int], *, complete: bool) -> None:
    count = math.ceil(file.size / file.part_size)
    if complete and numbers != list(range(1, count + 1)):
        raise ApplicationError(f"{file.path} has {count} parts: name each of 1..{count} once, with its ETag.")
    if not complete and not 0 < len(numbers) <= MAX_PARTS_PER_CALL:
        raise ApplicationError(f"ask for 1 to {MAX_PARTS_PER_CALL} parts of {file.path} at a time.")
    if not complete and any(not 1 <= n <= count for n in numbers):
        raise ApplicationError(f"{file.path} has parts 1..{count} only.")


def _upload_id(storage: Storage, key: str, file: ArtifactFile) -> str:
    """The file's multipart upload, created on first use. A retried first
    call may create a second one: the row keeps whichever was saved first
    and the other is aborted."""
    if file.upload_id:
        return file.upload_id
    created = storage.multipart_create(key)
    if ArtifactFile.objects.filter(pk=file.pk, upload_id="").update(upload_id=created):
        return created
    storage.multipart_abort(key, upload_id=created)
    file.refresh_from_db(fields=["upload_id"])
    return file.upload_id


def _check_relative(path: str) -> None:
    problem = path_problem(path)
    if problem:
        raise ApplicationError(f"artifact file path {path!r} {problem}.")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def path_problem(path: str, *, dot_start: bool = False, absolute_ok: bool = False) -> str:
    """Why ``path`` is not a file path inside an artifact ("" when it is):
    relative, "/"-separated, no empty, "." or ".." part, no backslash, drive
    letter, NUL or other control character. ``dot_start``: a leading "./"
    is allowed (an artifact's own path, ``./output``); ``absolute_ok``: so
    is a leading "/" (an artifact at an absolute path of the machine)."""
    if dot_start and path.startswith("./"):
        path = path[2:]
    if absolute_ok and path.startswith("/"):
        path = path[1:]
    if not path:
        return "is empty"
    if _CONTROL.search(path):
        return "has a control character (NUL, a line break, …)"
    if "\\" in path:
        return "has a backslash: separate folders with /"
    if path.startswith("/") or re.match(r"[A-Za-z]:", path):
        return "must be relative"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "must stay inside the artifact, without empty, '.' or '..' parts"
    return ""

"""Writes for stored bytes: code blobs and job artifacts."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

from django.conf import settings
from django.db import transaction

from backend.accounts.models import User, Workspace
from backend.artifacts.models import Artifact, ArtifactFile, ArtifactStatus, Blob
from backend.artifacts.storage import get_storage
from backend.core.errors import ApplicationError
from backend.runs.models import Job

UPLOAD_URL_SECONDS = 6 * 3600


@dataclass(frozen=True)
class FileIn:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Upload:
    path: str
    url: str


def blob_create(*, workspace: Workspace, user: User, chunks: Iterator[bytes]) -> Blob:
    """Stream an upload into storage, hashing as it goes; enforce the size cap."""
    blob_id = uuid.uuid4()
    key = f"workspaces/{workspace.pk}/blobs/{blob_id}"
    digest = hashlib.sha256()
    limit = settings.TRAINYARD["MAX_BLOB_BYTES"]
    seen = 0

    def hashed() -> Iterator[bytes]:
        nonlocal seen
        for chunk in chunks:
            seen += len(chunk)
            if seen > limit:
                raise ApplicationError(
                    f"The upload is larger than TRAINYARD_MAX_BLOB_BYTES ({limit} bytes): "
                    "add large files to .gitignore or push them to a remote.",
                    status_code=413,
                )
            digest.update(chunk)
            yield chunk

    size = get_storage().write(key, hashed())
    return Blob.objects.create(
        id=blob_id, workspace=workspace, size=size, sha256=digest.hexdigest(), storage_key=key, created_by=user
    )


def artifact_begin(*, job: Job, path: str, files: list[FileIn]) -> tuple[Artifact, list[Upload]]:
    """Record an artifact's manifest and hand out one signed PUT URL per file."""
    for f in files:
        _check_relative(f.path)
    prefix = f"workspaces/{job.workspace_id}/runs/{job.run_id}/jobs/{job.pk}/artifacts/{uuid.uuid4()}"
    with transaction.atomic():
        # A retried upload (runner reconnected) replaces the unfinished one.
        Artifact.objects.filter(job=job, path=path).delete()
        artifact = Artifact.objects.create(
            workspace_id=job.workspace_id,
            run_id=job.run_id,
            job=job,
            path=path,
            storage_prefix=prefix,
            total_size=sum(f.size for f in files),
        )
        ArtifactFile.objects.bulk_create(
            ArtifactFile(artifact=artifact, path=f.path, size=f.size, sha256=f.sha256) for f in files
        )
    storage = get_storage()
    # Files are uploaded one after another: every URL must outlive the whole upload.
    uploads = [
        Upload(f.path, storage.signed_url(f"{prefix}/{f.path}", method="PUT", seconds=UPLOAD_URL_SECONDS))
        for f in files
    ]
    return artifact, uploads


def artifact_complete(*, artifact: Artifact) -> Artifact:
    """Check that every file arrived whole before the artifact counts."""
    storage = get_storage()
    bad = [f.path for f in artifact.files.all() if not _stored_intact(storage, artifact, f)]
    if bad:
        raise ApplicationError(
            f"{len(bad)} file(s) of {artifact.path} are missing or differ from the manifest: upload them again.",
            extra={"files": bad[:50]},
        )
    Artifact.objects.filter(pk=artifact.pk).update(status=ArtifactStatus.COMPLETE)
    artifact.refresh_from_db()
    return artifact


def artifact_file_key(artifact: Artifact, file: ArtifactFile) -> str:
    return f"{artifact.storage_prefix}/{file.path}"


def _stored_intact(storage: object, artifact: Artifact, file: ArtifactFile) -> bool:
    from backend.artifacts.storage import Storage

    assert isinstance(storage, Storage)
    key = artifact_file_key(artifact, file)
    if storage.size(key) != file.size:
        return False
    digest = hashlib.sha256()
    with storage.open(key) as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest() == file.sha256


def _check_relative(path: str) -> None:
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or ".." in parts:
        raise ApplicationError(f"artifact file path {path!r} must be relative and stay inside the artifact.")

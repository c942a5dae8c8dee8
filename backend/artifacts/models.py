"""Stored bytes: code blobs (archives, patches) and job artifacts."""

from __future__ import annotations

from typing import Any

from django.db import models

from backend.accounts.models import WorkspaceOwnedModel, WorkspaceQuerySet
from backend.core.models import BaseModel


class StoredModel(WorkspaceOwnedModel):
    """Where the bytes are (backend/artifacts/locations.py): the local storage
    (no bucket), or ``storage_bucket`` of the AWS account ``storage_account``."""

    storage_account = models.ForeignKey(
        "clouds.CloudAccount", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    storage_bucket = models.CharField(max_length=63, blank=True)

    class Meta:
        abstract = True


class Blob(StoredModel):
    """An uploaded working-tree archive or patch of uncommitted changes."""

    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    storage_key = models.CharField(max_length=500)
    created_by = models.ForeignKey("accounts.User", null=True, on_delete=models.SET_NULL, related_name="+")


class ArtifactStatus(models.TextChoices):
    UPLOADING = "uploading"
    COMPLETE = "complete"


class ArtifactKind(models.TextChoices):
    OUTPUT = "output"  # a workflow's ``artifacts:`` path
    CHECKPOINT = "checkpoint"  # one version of a workflow's ``checkpoint:`` path
    CACHE = "cache"  # one saving of a workflow's ``cache:`` path (the workspace's latest is restored)


class OutputManager(models.Manager.from_queryset(WorkspaceQuerySet)):  # type: ignore[misc]
    """Only outputs: what every listing, input and cache lookup means by a
    job's artifacts. Checkpoint versions are reached through ``Artifact.stored``
    (backend/artifacts/checkpoints.py)."""

    def get_queryset(self) -> models.QuerySet[Artifact]:
        return super().get_queryset().filter(kind=ArtifactKind.OUTPUT)


class Artifact(StoredModel):
    """One output path of one job (``./base_model``) and its file manifest,
    or one version of its checkpoint (``kind`` checkpoint, ``number`` n of
    the job, uploaded by ``attempt``; ``base`` the version that was latest
    when it began: the compare-and-set guard)."""

    objects: Any = OutputManager()  # type: ignore[misc]
    stored: Any = WorkspaceQuerySet.as_manager()

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="artifacts")
    job = models.ForeignKey("runs.Job", on_delete=models.CASCADE, related_name="artifacts")
    path = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=ArtifactStatus.choices, default=ArtifactStatus.UPLOADING)
    storage_prefix = models.CharField(max_length=500)
    total_size = models.PositiveBigIntegerField(default=0)
    kind = models.CharField(max_length=16, choices=ArtifactKind.choices, default=ArtifactKind.OUTPUT)
    attempt = models.PositiveIntegerField(default=0)
    number = models.PositiveIntegerField(default=0)
    base = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    completed_at = models.DateTimeField(null=True, blank=True)
    # kind cache: "<code scope>\n<workflow>\n<path>" (``Run.code_scope``: the run's repository);
    # the workspace's latest complete one of a key is restored.
    cache_key = models.CharField(max_length=700, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                # One complete upload per path; the next one (a mounted artifact's, a retry's)
                # replaces it when it completes (artifacts.services.artifact_complete).
                fields=["job", "path"],
                condition=models.Q(kind="output", status="complete"),
                name="uniq_artifact_job_path",
            ),
            models.UniqueConstraint(
                fields=["job", "number"], condition=models.Q(kind="checkpoint"), name="uniq_checkpoint_number"
            ),
        ]
        indexes = [
            models.Index(
                fields=["workspace", "cache_key", "-completed_at"],
                condition=models.Q(kind="cache"),
                name="artifact_cache_latest",
            )
        ]
        base_manager_name = "stored"


class CheckpointLatest(BaseModel):
    """The one pointer to a job's latest complete checkpoint version. It
    moves only by a compare-and-set on ``version`` (the version a new one
    was based on), after every file of the new one is verified."""

    job = models.OneToOneField("runs.Job", on_delete=models.CASCADE, related_name="checkpoint_latest")
    version = models.ForeignKey(Artifact, on_delete=models.RESTRICT, related_name="+")


class ArtifactFile(BaseModel):
    """A file of an artifact; tenancy through ``artifact.workspace``."""

    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=1000)  # relative to the artifact path
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    # A file uploaded in parts (S3 multipart): the upload, its part size, and
    # the sha256 of every part once the runner has completed it.
    upload_id = models.CharField(max_length=1024, blank=True)
    part_size = models.PositiveBigIntegerField(default=0)
    part_sha256s = models.JSONField(default=list, blank=True)
    # A checkpoint file unchanged since the version this one is based on is
    # not uploaded again: it points at the object that holds it ("": the
    # artifact's own ``storage_prefix/path``).
    key = models.CharField(max_length=1500, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["artifact", "path"], name="uniq_artifact_file")]


class ExportStatus(models.TextChoices):
    PENDING = "pending"  # waiting for a worker (first time, or its next retry at ``next_attempt_at``)
    COPYING = "copying"
    DONE = "done"
    FAILED = "failed"  # every attempt failed; ``error`` says why


class ArtifactExport(WorkspaceOwnedModel):
    """The copy of one output path of one job to the place its workflow
    names (``artifacts: - to:``). It belongs to the job of this run, not to
    the stored artifact: a job reused from the cache copies its source's
    artifact to its own run's destination. ``artifact``: the stored upload
    copied (the job's own, or its source's); a newer upload of the path
    points it at the new one and starts over. The stored artifact is only
    read, never changed."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="exports")
    job = models.ForeignKey("runs.Job", on_delete=models.CASCADE, related_name="exports")
    path = models.CharField(max_length=500)
    artifact = models.ForeignKey(Artifact, null=True, on_delete=models.SET_NULL, related_name="exports")
    # s3://bucket/prefix/ with its variables filled in.
    destination = models.CharField(max_length=1100)
    status = models.CharField(max_length=16, choices=ExportStatus.choices, default=ExportStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    error = models.CharField(max_length=1000, blank=True)
    # A pending export is due then; a copying one was claimed then (the sweep
    # takes back one whose worker died: ``exports.exports_due``).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)
    objects_copied = models.PositiveIntegerField(default=0)
    bytes_copied = models.PositiveBigIntegerField(default=0)
    # "server-side" (CopyObject within S3) or "streamed" (read from storage, written to the destination).
    method = models.CharField(max_length=16, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "path"], name="uniq_export_job_path")]
        indexes = [
            models.Index(
                fields=["status", "next_attempt_at"],
                condition=models.Q(status__in=["pending", "copying"]),
                name="export_due",
            )
        ]

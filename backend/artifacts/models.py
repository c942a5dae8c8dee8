"""Stored bytes: code blobs (archives, patches) and job artifacts."""

from __future__ import annotations

from django.db import models

from backend.accounts.models import WorkspaceOwnedModel
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


class Artifact(StoredModel):
    """One output path of one job (``./base_model``) and its file manifest."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="artifacts")
    job = models.ForeignKey("runs.Job", on_delete=models.CASCADE, related_name="artifacts")
    path = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=ArtifactStatus.choices, default=ArtifactStatus.UPLOADING)
    storage_prefix = models.CharField(max_length=500)
    total_size = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "path"], name="uniq_artifact_job_path")]


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

    class Meta:
        constraints = [models.UniqueConstraint(fields=["artifact", "path"], name="uniq_artifact_file")]

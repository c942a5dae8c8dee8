"""A workspace's storage quota: the bytes of its stored objects (code blobs,
and the files of every artifact, checkpoint version and cache saving; a file
carried from an earlier version counts once, where its object is) against
its ``storage_quota_bytes``, or the installation's TRAINYARD_STORAGE_QUOTA_BYTES.

``quota_check`` runs inside the transaction that records a new upload, with
the workspace's row locked, so two uploads starting at once cannot both fit
in the room that is left for one."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.db.models import Sum

from backend.accounts.models import Workspace
from backend.artifacts.models import Artifact, ArtifactFile, Blob
from backend.core.errors import ApplicationError


@dataclass(frozen=True)
class Usage:
    used: int
    quota: int  # 0: none


def storage_usage(*, workspace_id: UUID | str) -> Usage:
    """Bytes stored now for the workspace, and its quota."""
    quota = Workspace.objects.filter(pk=workspace_id).values_list("storage_quota_bytes", flat=True).first()
    blobs = Blob.objects.filter(workspace_id=workspace_id).aggregate(n=Sum("size"))["n"] or 0
    own = Artifact.stored.filter(workspace_id=workspace_id).values("pk")
    files = ArtifactFile.objects.filter(artifact__in=own, key="").aggregate(n=Sum("size"))["n"] or 0
    return Usage(used=blobs + files, quota=settings.TRAINYARD["STORAGE_QUOTA_BYTES"] if quota is None else quota)


def quota_check(*, workspace_id: UUID | str, requested: int) -> None:
    """Raise 413 if ``requested`` more bytes would take the workspace over its
    quota. Call inside a transaction: it locks the workspace's row."""
    # NO KEY UPDATE: two uploads of the workspace wait for each other, but
    # rows that merely reference the workspace (runs, jobs, …) are not held up.
    list(Workspace.objects.select_for_update(no_key=True).filter(pk=workspace_id).values_list("pk", flat=True))
    usage = storage_usage(workspace_id=workspace_id)
    if usage.quota and usage.used + requested > usage.quota:
        raise over_quota(usage, requested)


def over_quota(usage: Usage, requested: int) -> ApplicationError:
    return ApplicationError(
        f"This workspace's storage quota is full: {_size(usage.used)} of {_size(usage.quota)} used, "
        f"{_size(requested)} more asked for. Delete runs you no longer need, or ask the installation's "
        "admin for a larger quota.",
        status_code=413,
        extra={"used_bytes": usage.used, "quota_bytes": usage.quota, "requested_bytes": requested},
    )


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"

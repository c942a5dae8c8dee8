"""A workspace's storage quota: the bytes of every object it stores (code
blobs; the files of every artifact, checkpoint version and cache saving, a
file carried from an earlier version counted once, where its object is;
packed environments; archived logs) against its ``storage_quota_bytes``, or
the installation's TRAINYARD_STORAGE_QUOTA_BYTES. Each object counts at
least ``MIN_OBJECT_BYTES`` (an artifact without files counts that too), so
rows of empty files are not free.

A log archive is never refused: its bytes were stored already (as chunk
rows, under the job's log cap) and archiving only moves them; from then on
they count here, and leave less room for uploads.

``quota_check`` runs inside the transaction that records a new upload, with
the workspace's row locked, so two uploads starting at once cannot both fit
in the room that is left for one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.db.models import F, QuerySet, Sum, Value
from django.db.models.functions import Greatest

from backend.accounts.models import Workspace
from backend.artifacts.models import Artifact, ArtifactFile, Blob
from backend.core.errors import ApplicationError
from backend.runs.models import EnvironmentArchive, LogArchive

# What one stored object counts at least: a filesystem block, and the rows
# that describe it.
MIN_OBJECT_BYTES = 4096


@dataclass(frozen=True)
class Usage:
    used: int
    quota: int  # 0: none


def storage_usage(*, workspace_id: UUID | str) -> Usage:
    """Bytes stored now for the workspace, and its quota."""
    quota = Workspace.objects.filter(pk=workspace_id).values_list("storage_quota_bytes", flat=True).first()
    artifacts = Artifact.stored.filter(workspace_id=workspace_id)
    used = (
        _charged(Blob.objects.filter(workspace_id=workspace_id))
        + _charged(ArtifactFile.objects.filter(artifact__in=artifacts.values("pk"), key=""))
        + MIN_OBJECT_BYTES * artifacts.filter(files__isnull=True).count()
        + _charged(EnvironmentArchive.objects.filter(workspace_id=workspace_id))
        + _charged(LogArchive.objects.filter(workspace_id=workspace_id))
    )
    return Usage(used=used, quota=settings.TRAINYARD["STORAGE_QUOTA_BYTES"] if quota is None else quota)


def charged(sizes: Iterable[int]) -> int:
    """What objects of ``sizes`` count against the quota (each at least ``MIN_OBJECT_BYTES``)."""
    return sum(max(size, MIN_OBJECT_BYTES) for size in sizes)


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


def _charged(rows: QuerySet) -> int:
    total = rows.aggregate(n=Sum(Greatest(F("size"), Value(MIN_OBJECT_BYTES))))["n"]
    return int(total or 0)


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"

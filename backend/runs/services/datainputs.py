"""A run's data inputs (``inputs:``), listed when it is submitted (docs/DATA.md).

Every job reads each input as it was listed here: the listing is stored as a
snapshot and its digest goes into the job's spec (``spec["data"][i]
["snapshot"]``), so it is part of the job's cache key and every attempt and
resume reads the same objects. One URI is listed once per submission, within
``LISTING_SECONDS`` for all of them. A re-run reads the recorded listing
again where every object of it has a version id; otherwise it lists afresh
(``rerun_notices`` says so).

A refusal names the workflow's file, line and key; nothing is written
unless every input listed (the caller writes inside its transaction after
this returned).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from trainyard_runner import protocol
from trainyard_spec import RunPlan, WorkflowError, WorkflowFileError, WorkflowsFile

from backend.clouds.models import Instance, InstanceStatus
from backend.core.errors import ApplicationError, NotFound
from backend.data.models import DataSnapshot
from backend.data.services import (
    PAGE_FILES,
    Listing,
    input_list,
    listing_of,
    snapshot_page,
    snapshot_store,
    snapshot_url,
)
from backend.runs.models import Job, Run

# The time all inputs of one submission may take to list.
LISTING_SECONDS = 60.0


@dataclass
class ListedInputs:
    """The listings of a plan's inputs, by (uri, sha256 pin)."""

    listings: dict[tuple[str, str], Listing] = field(default_factory=dict)

    def of(self, item: Mapping[str, Any]) -> Listing:
        return self.listings[(str(item["uri"]), str(item.get("sha256") or ""))]

    def store(self, *, workspace_id: UUID | str) -> None:
        """Write the snapshots (in the caller's transaction; no network)."""
        for listing in self.listings.values():
            snapshot_store(workspace_id=workspace_id, listing=listing)

    def data_of(self, planned: Any) -> list[dict[str, Any]]:
        """The job's ``data`` as its spec stores it: the workflow's item and the snapshot it reads."""
        return [{**item, "snapshot": self.of(item).digest} for item in planned.data]


def inputs_list(
    *, workspace_id: UUID | str, file: WorkflowsFile, plan: RunPlan, rerun_of: Run | None = None
) -> ListedInputs:
    """List every input of ``plan`` (each URI once), or raise an
    ``ApplicationError`` naming the first that cannot be read, with its
    workflow's file, line and key."""
    out = ListedInputs()
    deadline = time.monotonic() + LISTING_SECONDS
    recorded = _recorded(rerun_of)
    for planned in plan.jobs:
        for item in planned.data:
            key = (str(item["uri"]), str(item.get("sha256") or ""))
            if key in out.listings:
                continue
            again = recorded.get(key)
            if again is not None and again.versioned:
                out.listings[key] = listing_of(again)
                continue
            try:
                out.listings[key] = input_list(workspace_id=workspace_id, uri=key[0], sha256=key[1], deadline=deadline)
            except ApplicationError as e:
                raise _at_input(file, planned, item, e.message) from None
        _check_disk(file, planned, out)
    return out


def rerun_notices(run: Run) -> list[str]:
    """What a re-run reads that its original did not (docs/DATA.md, re-runs):
    one line per input whose bucket keeps no versions."""
    if run.rerun_of_id is None:
        return []
    seen: dict[str, str] = {}
    for spec in Job.objects.filter(run=run).values_list("spec", flat=True):
        for item in (spec or {}).get("data") or []:
            seen[str(item.get("snapshot", ""))] = str(item.get("uri", ""))
    unversioned = DataSnapshot.objects.filter(
        workspace_id=run.workspace_id, digest__in=list(seen), versioned=False
    ).values_list("digest", flat=True)
    return sorted(
        f"input {seen[d]}: the bucket keeps no versions: this re-run reads the objects as they are now"
        for d in unversioned
        if not seen[d].startswith("https://")
    ) + sorted(
        f"input {seen[d]}: read again from its URL: this re-run reads the file as it is now"
        for d in unversioned
        if seen[d].startswith("https://")
    )


def data_outlook(*, workspace_id: UUID | str, planned: Any, listed: ListedInputs) -> list[dict[str, Any]]:
    """The dry run's words for each data input of a planned job: what was
    listed, and which of the workspace's idle machines (the ones a job takes
    before a new one is started) hold it in their cache already."""
    out = []
    for item in planned.data:
        listing = listed.of(item)
        holders = list(
            Instance.objects.filter(
                workspace_id=workspace_id, status=InstanceStatus.IDLE, data_cached__contains=[listing.digest]
            )
            .order_by("name")
            .values_list("name", flat=True)[:5]
        )
        out.append(
            {
                "uri": item["uri"],
                "path": item["path"],
                "file_count": listing.file_count,
                "total_size": listing.total_size,
                "size": size_text(listing.total_size),
                "versioned": listing.versioned,
                "snapshot": listing.digest,
                "cached_on": holders,
            }
        )
    return out


def job_data_page(*, job: Job, path: str, after: str = "") -> protocol.DataPage:
    """One page of the files of the job's data input at ``path`` (ordered
    by file path, after ``after``), each with a URL to GET it."""
    snapshot = _snapshot_of(job, path)
    files, next_after = snapshot_page(snapshot=snapshot, after=after, limit=PAGE_FILES)
    return protocol.DataPage(
        path=path,
        files=[
            protocol.DataFile(path=f.path, size=f.size, url=f.url, etag=f.etag, sha256=f.sha256, identity=f.identity)
            for f in files
        ],
        next=next_after,
    )


def job_data_url(*, job: Job, path: str, file: str) -> str:
    """A fresh URL for one file of the job's data input at ``path`` (after
    a presigned URL expired)."""
    return snapshot_url(snapshot=_snapshot_of(job, path), path=file)


def size_text(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:,} bytes"


# ------------------------------------------------------------------ helpers


def _snapshot_of(job: Job, path: str) -> DataSnapshot:
    item = next((i for i in job.spec.get("data") or [] if i.get("path") == path), None)
    snapshot = (
        DataSnapshot.objects.filter(workspace_id=job.workspace_id, digest=str(item.get("snapshot", ""))).first()
        if item is not None
        else None
    )
    if snapshot is None:
        raise NotFound(f"{path!r} is not a data input of this job.", extra={"path": path})
    return snapshot


def _recorded(run: Run | None) -> dict[tuple[str, str], DataSnapshot]:
    """The snapshots ``run``'s jobs read, by (uri, sha256 pin)."""
    if run is None:
        return {}
    wanted: dict[str, tuple[str, str]] = {}
    for spec in Job.objects.filter(run=run).values_list("spec", flat=True):
        for item in (spec or {}).get("data") or []:
            wanted[str(item.get("snapshot", ""))] = (str(item["uri"]), str(item.get("sha256") or ""))
    found = DataSnapshot.objects.filter(workspace_id=run.workspace_id, digest__in=list(wanted))
    return {wanted[s.digest]: s for s in found}


def _check_disk(file: WorkflowsFile, planned: Any, listed: ListedInputs) -> None:
    disk = planned.resources.disk_bytes
    if not disk or not planned.data:
        return
    sizes = [(item, listed.of(item).total_size) for item in planned.data]
    total = sum(size for _, size in sizes)
    if total <= disk:
        return
    biggest = max(sizes, key=lambda pair: pair[1])[0]
    words = ", ".join(f"{item['uri']} {size_text(size)}" for item, size in sizes)
    raise _at_input(
        file,
        planned,
        biggest,
        f"the inputs of job {planned.name} hold {size_text(total)} ({total:,} bytes: {words}), more than its "
        f"resources.disk of {size_text(disk)} ({disk:,} bytes): ask for more disk or name a narrower prefix",
    )


def _at_input(file: WorkflowsFile, planned: Any, item: Mapping[str, Any], message: str) -> ApplicationError:
    wf = file.workflows.get(planned.workflow)
    index = next((i for i, it in enumerate(wf.inputs) if it.target == item["path"]), None) if wf else None
    if wf is None or index is None:
        error = WorkflowError(file.path, None, f"{planned.workflow}.inputs", message)
    else:
        error = file.error(wf, ("inputs", index), message)
    exc = WorkflowFileError([error])
    return ApplicationError(str(exc), extra={"errors": [dataclasses.asdict(e) for e in exc.errors]})

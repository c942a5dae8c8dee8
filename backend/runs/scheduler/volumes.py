"""Jobs with volumes (docs/DATA.md, "Volumes"): where they may run, and one
job at a time per volume.

A job whose spec names ``volumes`` runs only where its volumes are: on
machines and offers of the volume's account, region and zone (aws), on
local machines (local), or on the one machine a self-hosted volume was
created for. A volume is held by one job at a time (``Volume.attached_job``,
a compare-and-set here): a second job waits, saying which job of which run
has it, until the first one is over (``clouds.services.volumes.volumes_release``
lets it go).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from backend.clouds.backends.base import Offer
from backend.clouds.models import BackendKind, Volume, VolumeStatus
from backend.clouds.services.offers import Candidate
from backend.core.enqueue import enqueue
from backend.runs.lifecycle.dispatch import assignment_send_isolated
from backend.runs.lifecycle.transitions import attempt_end
from backend.runs.models import Attempt, Job, JobStatus
from backend.runs.reasons import TerminationReason

# Attach failures the cloud may get over (throttling, a volume still
# detaching elsewhere) send the job back to pending this many times in a row
# without counting against its ``retry:``; then they count like an error.
ATTACH_TRIES_UNCOUNTED = 3

# A job in one of these holds the volumes it claimed; a volume held by a job
# in any other status is free.
HOLDING = (JobStatus.PENDING, JobStatus.ASSIGNED, JobStatus.RUNNING, JobStatus.STOPPING)


@dataclass(frozen=True)
class Where:
    """Where a job's volumes are; every machine and offer it takes must be there."""

    backend: str
    account_id: str
    region: str
    zone_names: frozenset[str]  # the zone by name ("us-east-1a") and by id ("use1-az6")
    machine_id: str  # self-hosted: the one machine
    zone: str = ""  # the zone by name, as the user named it

    def words(self) -> str:
        zone = sorted(self.zone_names)[0] if self.zone_names else ""
        return " ".join(filter(None, (self.backend, self.region if self.backend == BackendKind.AWS else "", zone)))


def wanted(job: Job) -> list[str]:
    return [str(v["name"]) for v in job.spec.get("volumes") or ()]


def volumes_where(job: Job) -> Where | None:
    """Where the job's volumes are (its first volume's place: the planner
    refuses volumes in different places); None for a job without volumes."""
    names = wanted(job)
    if not names:
        return None
    volume = (
        Volume.objects.filter(workspace_id=job.workspace_id)
        .select_related("account")
        .filter(name=names[0])
        .exclude(status__in=(VolumeStatus.DELETED, VolumeStatus.DELETING))
        .first()
    )
    if volume is None:
        return Where(backend="-", account_id="", region="", zone_names=frozenset(), machine_id="")
    zones = {volume.zone} if volume.zone else set()
    facts = ((volume.account.config or {}).get("facts") or {}) if volume.account else {}
    region_zones = ((facts.get("regions") or {}).get(volume.region) or {}).get("zones") or {}
    zones |= {str(zone_id) for zone_id, name in region_zones.items() if name == volume.zone}
    return Where(
        backend=volume.backend,
        account_id=str(volume.account_id or ""),
        region=volume.region,
        zone_names=frozenset(zones),
        machine_id=str(volume.machine_id or ""),
        zone=volume.zone,
    )


def volumes_outlook(*, workspace_id: Any, planned: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A planned job's volumes as ``--dry-run`` shows them: each one's name,
    path, where it is (``aws us-east-1 us-east-1b``, ``machine gpu-box``,
    ``local``) and the job of which run holds it now (None: free)."""
    names = [str(item["name"]) for item in planned]
    found = {
        v.name: v
        for v in Volume.objects.filter(workspace_id=workspace_id, name__in=names)
        .exclude(status__in=(VolumeStatus.DELETED, VolumeStatus.DELETING))
        .select_related("machine", "attached_job__run")
    }
    out = []
    for item in planned:
        volume = found.get(str(item["name"]))
        holder = volume.attached_job if volume is not None else None
        held = holder is not None and holder.status in HOLDING
        out.append(
            {
                "name": str(item["name"]),
                "path": str(item["path"]),
                "read_only": bool(item.get("read_only", False)),
                "where": _where_words(volume),
                "size_bytes": volume.size_bytes if volume is not None else 0,
                "held_by": {"job": holder.name, "run": holder.run.name} if held and holder is not None else None,
            }
        )
    return out


def _where_words(volume: Volume | None) -> str:
    if volume is None:
        return "not found"
    if volume.backend == BackendKind.SELF_HOSTED:
        return f"machine {volume.machine.name if volume.machine else '(gone)'}"
    return " ".join(filter(None, (volume.backend, volume.region, volume.zone)))


def instances_there(where: Where) -> Q:
    """The machines (Instance rows) where the volumes are."""
    nowhere = Q(pk__in=[])
    if where.backend == BackendKind.SELF_HOSTED:
        return Q(pk=where.machine_id) if where.machine_id else nowhere
    allowed = Q(backend=where.backend)
    if where.backend == BackendKind.AWS:
        if not where.account_id:
            return nowhere
        allowed &= Q(account_id=where.account_id, region=where.region, zone__in=where.zone_names)
    return allowed


def offers_there(where: Where, candidates: list[Candidate]) -> list[Candidate]:
    """The offers that launch a machine where the volumes are: an aws offer
    only when it is pinned to the volume's zone."""
    return [c for c in candidates if _offer_there(where, str(c.account.pk), c.offer)]


def _offer_there(where: Where, account_id: str, offer: Offer) -> bool:
    if where.backend == BackendKind.SELF_HOSTED or offer.backend != where.backend:
        return False  # a self-hosted machine is registered, never launched from an offer
    if where.backend != BackendKind.AWS:
        return True
    zone_name = str(offer.data.get("zone_name", ""))
    return (
        account_id == where.account_id
        and offer.region == where.region
        and (offer.zone in where.zone_names or zone_name in where.zone_names)
    )


def volumes_claim(job: Job) -> str:
    """Hold every volume the job names for it; "" when it holds them all,
    else why it waits (``waiting for volume NAME (attached to job X of run
    Y)``), or fails it when a volume is gone. Each claim is a compare-and-set:
    a volume free, or already this job's, or held by a job that is over."""
    for name in sorted(wanted(job)):  # one order for every job: two never wait for each other
        volume = (
            Volume.objects.filter(workspace_id=job.workspace_id)
            .filter(name=name)
            .exclude(status__in=(VolumeStatus.DELETED, VolumeStatus.DELETING, VolumeStatus.FAILED))
            .first()
        )
        if volume is None:
            return f"waiting for volume {name}: it no longer exists in this workspace (create it or stop the run)"
        free = Q(attached_job=None) | Q(attached_job=job) | ~Q(attached_job__status__in=HOLDING)
        if Volume.objects.filter(free, pk=volume.pk).update(attached_job=job):
            continue
        holder_id = Volume.objects.filter(pk=volume.pk).values_list("attached_job_id", flat=True).first()
        holder = Job.objects.select_related("run").filter(pk=holder_id).first() if holder_id else None
        if holder is None:
            return f"waiting for volume {name}"
        return f"waiting for volume {name} (attached to job {holder.name} of run {holder.run.name})"
    return ""


def volumes_release_after(attempt_id: str, reason: str, message: str) -> None:
    """An attempt ended (``events.on_attempt_end``): its job's volumes are
    detached from its machine by a task (cloud calls), and a pass is asked
    for, so a job waiting for them takes them."""
    job_id = Attempt.objects.filter(pk=attempt_id).values_list("job_id", flat=True).first()
    if job_id is not None and Volume.objects.filter(attached_job_id=job_id).exists():
        enqueue("backend.clouds.tasks.volumes_release", str(job_id), after_commit=False)


def assignments_send(attempts: list[Attempt]) -> None:
    """Each attempt's ``AssignJob`` to its runner (``assignment_send``), one failure not stopping the others."""
    for attempt in attempts:
        assignment_send(attempt)


def assignment_send(attempt: Attempt) -> None:
    """Send the attempt's ``AssignJob``. When one of the job's volumes could
    not be attached, the attempt ends now with why ("could not attach volume
    ckpt: …") instead of when its lease runs out: a transient failure sends
    the job back to pending, uncounted, up to ``ATTACH_TRIES_UNCOUNTED``
    times in a row; a permanent one (or one more transient) ends it as an
    error, which the job's ``retry:`` decides on like any other."""
    refused = assignment_send_isolated(attempt)
    if refused is None:
        return
    earlier = Attempt.objects.filter(job_id=attempt.job_id, number__lt=attempt.number).order_by("-number")
    messages = list(earlier.values_list("termination_message", flat=True)[:ATTACH_TRIES_UNCOUNTED])
    in_a_row = next((i for i, m in enumerate(messages) if not m.startswith("could not attach volume")), len(messages))
    again = refused.transient and in_a_row < ATTACH_TRIES_UNCOUNTED
    attempt_end(
        attempt_id=str(attempt.pk),
        reason=TerminationReason.REJECTED if again else TerminationReason.ERROR,
        message=refused.message,
        tell_runner=True,
    )

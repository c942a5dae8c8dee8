"""Persistent volumes of a workspace (docs/DATA.md, "Volumes"): made,
attached to the machine of the one job that holds them, detached after,
deleted when nobody uses them.

This module is the only code that writes ``Volume.status``. Backend calls
(``Compute.volume_*``) are made outside any transaction; each state change
is a compare-and-set. A volume is held for one job at a time
(``attached_job``, set by the scheduler: ``runs.scheduler.volumes``); this
module attaches it to that job's machine before the job is sent there
(``volumes_attach_for``) and detaches it when the job's attempt is over
(``volumes_release``) or its machine is gone (``volumes_reconcile``).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from pydantic_core import PydanticCustomError
from trainyard_spec._units import parse_size

from backend.accounts.models import User, Workspace
from backend.clouds.backends.base import Compute, Handle, VolumeInfo, VolumeSpec
from backend.clouds.backends.errors import ComputeError
from backend.clouds.models import (
    ENDED_STATUSES,
    LIVE_STATUSES,
    LIVE_VOLUME_STATUSES,
    BackendKind,
    CloudAccount,
    Instance,
    Volume,
    VolumeStatus,
)
from backend.clouds.services.accounts import accounts_usable, compute_of
from backend.clouds.services.instances import handle_of
from backend.core.errors import ApplicationError, NotFound

logger = logging.getLogger(__name__)

NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
VOLUME_BACKENDS = (BackendKind.AWS, BackendKind.LOCAL, BackendKind.SELF_HOSTED)
MAX_VOLUMES_PER_WORKSPACE = 100
# After a detach, how long an attach waits for the volume to be free.
DETACH_WAIT_SECONDS = 60.0
# A job's statuses in which it still holds its volumes (runs.models.JobStatus, by value).
HOLDING_JOB_STATUSES = ("pending", "assigned", "running", "stopping")


class VolumeNotAttached(ApplicationError):
    """A volume of a job could not be attached to its machine. The message
    starts "could not attach volume <name>: "; ``transient``: the same attach
    may succeed later (the cloud throttled, the volume is still detaching
    elsewhere), else it cannot (the volume is gone, the cloud refuses it)."""

    def __init__(self, name: str, why: str, *, transient: bool) -> None:
        super().__init__(f"could not attach volume {name}: {why}")
        self.transient = transient


@dataclass(frozen=True)
class Mount:
    """A volume attached for a job, as the runner gets it (``protocol.VolumeMount``)."""

    name: str
    volume_id: str
    kind: str  # "ebs" | "directory"
    path: str
    device: str
    read_only: bool


def volumes_of(*, workspace_id: Any) -> list[Volume]:
    """The workspace's volumes that are not deleted, by name."""
    return list(
        Volume.objects.filter(workspace_id=workspace_id)
        .filter(status__in=(*LIVE_VOLUME_STATUSES, VolumeStatus.FAILED))
        .select_related("attached_instance", "attached_job", "attached_job__run", "machine")
        .order_by("name")
    )


def volume_get(*, workspace_id: Any, name: str) -> Volume:
    found: Volume | None = (
        Volume.objects.filter(workspace_id=workspace_id)
        .exclude(status=VolumeStatus.DELETED)
        .select_related("attached_instance", "attached_job", "attached_job__run", "machine", "account")
        .filter(name=name)
        .first()
    )
    if found is None:
        raise NotFound(f"no volume {name!r} in this workspace; `trainyard volume ls` lists them")
    return found


def volumes_check_plan(
    *, workspace_id: Any, job: str, wanted: list[str], backends: list[str], regions: list[str]
) -> None:
    """At submission: each volume ``job`` names exists in the workspace, the
    job's ``backends`` and ``regions`` (when it names any) include the
    volume's, and all its volumes are in one place (one machine can mount
    them all); else an ``ApplicationError`` naming both sides."""
    places: dict[str, str] = {}
    for name in wanted:
        volume = (
            Volume.objects.filter(workspace_id=workspace_id)
            .select_related("machine")
            .filter(name=name, status__in=(VolumeStatus.CREATING, VolumeStatus.AVAILABLE, VolumeStatus.ATTACHED))
            .first()
        )
        if volume is None:
            known = ", ".join(v.name for v in volumes_of(workspace_id=workspace_id)[:20])
            raise ApplicationError(
                f"job {job}: volume {name!r} does not exist in this workspace"
                + (f" (volumes: {known})" if known else "")
                + f"; create it with: trainyard volume create {name} --size 100GB --backend aws --region us-east-1"
            )
        if backends and volume.backend not in backends:
            raise ApplicationError(
                f"job {job}: volume {name!r} is on the {volume.backend} backend, but the workflow's backends are "
                f"{', '.join(backends)}; add {volume.backend} to backends or use a volume of those"
            )
        if volume.backend == BackendKind.AWS and regions and volume.region not in regions:
            raise ApplicationError(
                f"job {job}: volume {name!r} is in region {volume.region} ({volume.zone}), but the workflow's "
                f"regions are {', '.join(regions)}; a job runs where its volumes are: add {volume.region} to "
                "regions or use a volume in one of those"
            )
        places[name] = volume.where()
    if len(set(places.values())) > 1:
        listed = ", ".join(f"{n} in {w}" for n, w in places.items())
        raise ApplicationError(
            f"job {job}: its volumes are in different places ({listed}); one machine mounts them all"
        )


def volume_create(
    *,
    workspace: Workspace,
    user: User | None,
    name: str,
    size: str,
    backend: str,
    region: str = "",
    zone: str = "",
    machine: str = "",
) -> Volume:
    """Check the request, write the row (``creating``), ask the backend
    for the volume, and record what it made (``available``) or why it
    could not (``failed``, and the row is deleted so the name is free)."""
    if not NAME.match(name or ""):
        raise ApplicationError(
            f"volume name {name!r}: 1 to 63 lowercase letters, digits and dashes, starting and ending with a"
            " letter or digit (e.g. imagenet-cache)"
        )
    size_bytes = _size(size)
    if backend not in VOLUME_BACKENDS:
        raise ApplicationError(f"backend {backend!r}: volumes live on {', '.join(VOLUME_BACKENDS)}")
    account, on_machine = _where(workspace, backend=backend, machine=machine)
    if backend == BackendKind.AWS:
        configured = [str(r) for r in (account.config or {}).get("regions") or ()] if account else []
        region = region or (configured[0] if configured else "")
        if not region:
            raise ApplicationError("an aws volume needs --region (the aws account names no region)")
        if zone and not zone.startswith(region):
            raise ApplicationError(f"zone {zone!r} is not in region {region} (e.g. {region}a)")
    else:
        if zone:
            raise ApplicationError(f"--zone is for aws volumes; a {backend} volume is a folder")
        region = BackendKind.LOCAL if backend == BackendKind.LOCAL else ""
    if (
        Volume.objects.for_workspace(workspace).filter(status__in=LIVE_VOLUME_STATUSES).count()
        >= MAX_VOLUMES_PER_WORKSPACE
    ):
        raise ApplicationError(f"a workspace has at most {MAX_VOLUMES_PER_WORKSPACE} volumes; delete one first")
    try:
        with transaction.atomic():
            volume = Volume.objects.create(
                workspace=workspace,
                name=name,
                backend=backend,
                account=account,
                region=region,
                zone=zone,
                size_bytes=size_bytes,
                machine=on_machine,
                created_by=user,
            )
    except IntegrityError:
        raise ApplicationError(f"a volume named {name!r} exists in this workspace already") from None
    compute = _compute(volume)
    spec = VolumeSpec(
        key=str(volume.pk),
        name=name,
        region=region,
        zone=zone,
        size_bytes=size_bytes,
        tags={"trainyard:workspace": str(workspace.pk)},
    )
    try:
        made = compute.volume_create(spec)
    except ComputeError as error:
        Volume.objects.filter(pk=volume.pk).delete()
        raise ApplicationError(f"could not create volume {name!r}: {error}") from None
    Volume.objects.filter(pk=volume.pk, status=VolumeStatus.CREATING).update(
        status=VolumeStatus.AVAILABLE, backend_id=made.backend_id, zone=made.zone or zone
    )
    volume.refresh_from_db()
    return volume


def volume_delete(*, volume: Volume) -> Volume:
    """Refused while a job holds it (naming the job and its run); else it
    is detached from the machine it is still on, deleted in the backend and
    marked deleted."""
    holder = _holder(volume)
    if holder is not None:
        raise ApplicationError(
            f"volume {volume.name!r} is in use by job {holder.name} of run {holder.run.name} ({holder.status}); "
            f"stop it first (trainyard stop {holder.run.name})",
            extra={"job": str(holder.pk), "run": holder.run.name},
        )
    taken = Volume.objects.filter(
        Q(attached_job=None) | ~Q(attached_job__status__in=HOLDING_JOB_STATUSES),
        pk=volume.pk,
        status__in=(VolumeStatus.AVAILABLE, VolumeStatus.ATTACHED, VolumeStatus.FAILED, VolumeStatus.DELETING),
    ).update(status=VolumeStatus.DELETING, attached_job=None)
    if not taken:
        raise ApplicationError(f"volume {volume.name!r} is {volume.status}; try again in a moment")
    volume.refresh_from_db()
    _delete_now(volume)
    volume.refresh_from_db()
    return volume


def volumes_attach_for(*, job_id: Any, instance: Instance, wanted: list[dict[str, Any]]) -> list[Mount]:
    """Attach each volume of ``wanted`` (the job's spec ``volumes``) that
    the job holds to ``instance`` (detaching it first from a machine it is
    still on), and say how the runner mounts it. ``ApplicationError`` when
    one is not held by the job or cannot be attached: ``VolumeNotAttached``."""
    mounts = []
    for item in wanted:
        volume = (
            Volume.objects.select_related("attached_instance", "account")
            .filter(workspace_id=instance.workspace_id, name=item["name"], attached_job_id=job_id)
            .exclude(status__in=(VolumeStatus.DELETING, VolumeStatus.DELETED))
            .first()
        )
        if volume is None:
            raise VolumeNotAttached(item["name"], "it is not held for this job (deleted meanwhile?)", transient=False)
        try:
            device = _attach(volume, instance)
        except ComputeError as error:
            raise VolumeNotAttached(
                volume.name, f"{error} ({volume.backend_id})", transient=error.retry_after is not None
            ) from None
        compute = _compute(volume)
        mounts.append(
            Mount(
                name=volume.name,
                volume_id=volume.backend_id,
                kind=compute.volume_kind,
                path=str(item["path"]),
                device=device,
                read_only=bool(item.get("read_only", False)),
            )
        )
    return mounts


def volumes_release(*, job_id: Any) -> int:
    """After an attempt of ``job_id`` ended: every volume attached for it
    is detached from its machine (the runner unmounted it before it sent
    the attempt's end); the job keeps holding it while it may run again
    (retried, resumed after an interruption), and lets it go once it is
    over. How many were detached."""
    detached = 0
    for volume in Volume.objects.select_related("attached_instance", "account", "attached_job").filter(
        attached_job_id=job_id
    ):
        job = volume.attached_job
        live = job is not None and job.status in ("assigned", "running", "stopping") and job.instance_id is not None
        if live:
            continue  # its next attempt runs already (assigned meanwhile)
        if volume.attached_instance is not None and _detach(volume):
            detached += 1
        if job is None or job.status not in HOLDING_JOB_STATUSES:
            Volume.objects.filter(pk=volume.pk, attached_job_id=job_id).update(attached_job=None)
    return detached


def volumes_reconcile() -> int:
    """The volumes' pass (Celery beat): 1. a volume attached to a machine
    that ended, or for no job that still runs, is detached; 2. a delete not
    confirmed is asked again; 3. per account, the volumes Trainyard made
    (found by tag) that have no row are adopted as rows again (named
    ``lost-<id>``), so a user sees them and can delete them; a volume whose
    row says deleted is deleted again. Never deletes a volume of a live row."""
    changed = 0
    stale = Volume.objects.select_related("attached_instance", "attached_job", "account").filter(
        status=VolumeStatus.ATTACHED
    )
    for volume in stale:
        instance = volume.attached_instance
        job = volume.attached_job
        running_here = (
            job is not None
            and job.instance_id == getattr(instance, "pk", None)
            and job.status
            in (
                "assigned",
                "running",
                "stopping",
            )
        )
        if instance is None or instance.status in ENDED_STATUSES or not running_here:
            changed += int(_detach(volume))
    for volume in Volume.objects.select_related("account", "attached_instance").filter(status=VolumeStatus.DELETING):
        _delete_now(volume)
        changed += 1
    for account in CloudAccount.objects.filter(kind=BackendKind.AWS):
        changed += _adopt_lost(account)
    return changed


# ---------------------------------------------------------------------- helpers


def _size(size: str) -> int:
    try:
        value = parse_size(size)
    except PydanticCustomError as error:
        raise ApplicationError(f"size {size!r}: {error} (e.g. 500GB)") from None
    if value <= 0:
        raise ApplicationError(f"size {size!r}: more than nothing (e.g. 500GB)")
    return value


def _where(workspace: Workspace, *, backend: str, machine: str) -> tuple[CloudAccount | None, Instance | None]:
    """The account (and, self-hosted, the machine) a new volume belongs to."""
    if backend == BackendKind.SELF_HOSTED:
        if not machine:
            raise ApplicationError(
                "a self-hosted volume is a folder of one machine: name it with --machine NAME (trainyard machines ls)"
            )
        found = (
            Instance.objects.for_workspace(workspace)
            .filter(backend=BackendKind.SELF_HOSTED, name=machine, status__in=LIVE_STATUSES)
            .first()
        )
        if found is None:
            raise ApplicationError(f"no self-hosted machine {machine!r} is registered in this workspace")
        return found.account, found
    if machine:
        raise ApplicationError(f"--machine is for self-hosted volumes; an {backend} volume is not bound to a machine")
    accounts = [a for a in accounts_usable(workspace_id=workspace.pk) if a.kind == backend]
    if not accounts:
        raise ApplicationError(f"no {backend} account is connected to this workspace (trainyard backend add {backend})")
    return accounts[0], None


def _compute(volume: Volume) -> Compute:
    account = volume.account or (volume.machine.account if volume.machine else None)
    if account is None:
        raise ApplicationError(f"volume {volume.name!r} has no account left to reach it")
    return compute_of(account)


def _holder(volume: Volume) -> Any:
    """The job holding ``volume`` now (with its run), if any."""
    job = volume.attached_job
    if job is None or job.status not in HOLDING_JOB_STATUSES:
        return None
    return job


def _info(volume: Volume) -> VolumeInfo:
    return VolumeInfo(
        key=str(volume.pk),
        backend_id=volume.backend_id,
        region=volume.region,
        zone=volume.zone,
        size_bytes=volume.size_bytes,
    )


def _attach(volume: Volume, instance: Instance) -> str:
    """Attach ``volume`` to ``instance`` (first detached from the machine it
    is still on, waiting up to ``DETACH_WAIT_SECONDS`` for it to be free);
    the device it is attached as."""
    compute = _compute(volume)
    if not compute.volume_kind or compute.volume_kind == "directory":
        Volume.objects.filter(pk=volume.pk).exclude(status=VolumeStatus.DELETING).update(
            status=VolumeStatus.ATTACHED, attached_instance=instance, device=""
        )
        return ""
    machine = handle_of(instance)
    deadline = time.monotonic() + DETACH_WAIT_SECONDS
    while True:
        now = compute.volume_describe([_info(volume)])[str(volume.pk)]
        if now.state == "not_found":
            raise VolumeNotAttached(volume.name, f"{volume.backend_id} no longer exists in the cloud", transient=False)
        if now.attached_to and now.attached_to != instance.backend_id:
            compute.volume_detach(now, Handle(key="", backend_id=now.attached_to, region=volume.region))
        elif now.state in ("available", "in-use"):
            break
        if time.monotonic() > deadline:
            raise VolumeNotAttached(
                volume.name,
                f"{volume.backend_id} is still {now.state}"
                + (f" on {now.attached_to}" if now.attached_to else "")
                + f" after {DETACH_WAIT_SECONDS:.0f}s",
                transient=True,
            )
        time.sleep(1.0)
    device = compute.volume_attach(now, machine)
    Volume.objects.filter(pk=volume.pk).exclude(status=VolumeStatus.DELETING).update(
        status=VolumeStatus.ATTACHED, attached_instance=instance, device=device
    )
    return device


def _detach(volume: Volume) -> bool:
    """Detach ``volume`` from its machine (a machine gone is success); True when the row changed."""
    instance = volume.attached_instance
    if instance is not None:
        try:
            _compute(volume).volume_detach(_info(volume), handle_of(instance))
        except (ComputeError, ApplicationError):
            logger.warning("detaching volume %s from %s failed; the next pass tries again", volume.pk, instance.pk)
            return False
    return bool(
        Volume.objects.filter(pk=volume.pk, status=VolumeStatus.ATTACHED, attached_instance=instance).update(
            status=VolumeStatus.AVAILABLE, attached_instance=None, device=""
        )
    )


def _delete_now(volume: Volume) -> None:
    """Detach and delete a ``deleting`` volume in its backend; on success it is ``deleted``."""
    try:
        compute = _compute(volume)
        if volume.attached_instance is not None:
            compute.volume_detach(_info(volume), handle_of(volume.attached_instance))
        compute.volume_delete(_info(volume))
    except (ComputeError, ApplicationError) as error:
        Volume.objects.filter(pk=volume.pk).update(status_reason=f"delete not confirmed yet: {error}"[:1000])
        return
    Volume.objects.filter(pk=volume.pk, status=VolumeStatus.DELETING).update(
        status=VolumeStatus.DELETED, attached_instance=None, device="", status_reason=""
    )


def _adopt_lost(account: CloudAccount) -> int:
    try:
        compute = compute_of(account)
        found = compute.volumes_managed()
    except Exception:  # a broken account: its own checks say why
        logger.warning("listing the volumes of account %s failed", account.pk, exc_info=True)
        return 0
    changed = 0
    rows = {str(v.pk): v for v in Volume.objects.filter(pk__in=[f.key for f in found if _is_uuid(f.key)])}
    for info in found:
        row = rows.get(info.key)
        if row is not None:
            if row.status == VolumeStatus.DELETED:
                try:
                    compute.volume_delete(info)
                    changed += 1
                except ComputeError:
                    logger.warning("deleting volume %s again failed", info.backend_id)
            continue
        if Volume.objects.filter(account=account, backend_id=info.backend_id).exists():
            continue
        name = f"lost-{info.backend_id.removeprefix('vol-')}"[:63]
        with transaction.atomic():
            Volume.objects.create(
                workspace_id=account.workspace_id,
                name=name,
                backend=account.kind,
                account=account,
                region=info.region,
                zone=info.zone,
                size_bytes=info.size_bytes,
                backend_id=info.backend_id,
                status=VolumeStatus.AVAILABLE,
                status_reason="found by its tags with no row: Trainyard made it and lost its record",
            )
        changed += 1
    return changed


def _is_uuid(value: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", value))

"""Matching pending jobs to runners, and asking backends for more runners.

Called from Celery tasks (``runs.tasks.schedule``), never from a request.
Safe to run concurrently in several workers: pending jobs and idle instances
are claimed with ``SELECT … FOR UPDATE SKIP LOCKED``.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from trainyard_runner import protocol

from backend.accounts.services import hash_token
from backend.artifacts.services import artifact_file_key
from backend.artifacts.storage import get_storage
from backend.clouds.backends import get_backend
from backend.clouds.backends.base import BackendError, Requirements
from backend.clouds.backends.local.backend import host_capacity
from backend.clouds.models import LIVE_STATUSES, BackendKind, Instance, InstanceStatus
from backend.runs.events import send_to_channel
from backend.runs.models import Job, JobStatus, Run
from backend.runs.services.dag import cacheable, job_cache_key, job_inputs, readiness
from backend.runs.services.dag import cached_source as find_cached_source
from backend.runs.services.transitions import (
    job_fail_pending,
    job_finish,
    job_reuse,
    run_refresh,
)
from backend.vault.services import secret_env

logger = logging.getLogger(__name__)

# Signed URLs for a job's inputs and code: long enough for big downloads.
DOWNLOAD_URL_SECONDS = 6 * 3600
# Key of the Postgres advisory lock that serialises scheduling passes.
SCHEDULER_LOCK = 0x7472_6169_6E79  # "trainy"
# After a runner failed to start, wait this long before trying again.
PROVISION_RETRY_SECONDS = 30


@dataclass(frozen=True)
class ScheduleResult:
    assigned: list[str]
    provisioned: list[str]
    waiting: list[str]


def jobs_schedule(*, limit: int = 100) -> ScheduleResult:
    """1. Claim pending jobs, oldest first. 2. Fail those whose dependencies
    failed; skip those whose dependencies are not done. 3. Reuse a cached
    result where one exists. 4. Give the rest an idle runner of their
    workspace that fits. 5. For the others, say why they wait, and start
    local runners while the pool has room. 6. After commit: send the
    assignments and start the processes (no network or process calls inside
    the transaction)."""
    host_capacity()  # probes nvidia-smi once per process: keep it out of the transaction
    assigned: list[Job] = []
    to_provision: list[Instance] = []
    to_retire: list[Instance] = []
    waiting: list[str] = []
    with transaction.atomic():
        # One pass at a time across all workers: the pool-size check and the
        # new Instance rows must not race (two passes once started 7 of 4).
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SCHEDULER_LOCK])
        jobs = list(
            Job.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(status=JobStatus.PENDING)
            .select_related("run", "run__patch_blob", "run__archive_blob")
            .order_by("created_at")[:limit]
        )
        budget = _pool_room()
        for job in jobs:
            if not _ready(job) or _reused(job):
                continue
            instance = _claim_runner(job)
            if instance is not None:
                _assign(job, instance)
                assigned.append(job)
                continue
            reason, new_instance, retire = _wait_or_provision(job, budget)
            if new_instance is not None:
                budget -= 1
                to_provision.append(new_instance)
            if retire is not None:
                to_retire.append(retire)
            waiting.append(str(job.pk))
            _set_waiting_reason(job, reason)
    for job in assigned:
        job_send_assignment(job=job)
    for instance in to_retire:
        instance_retire(instance=instance, reason="retired to make room for another workspace's job")
    for instance in to_provision:
        instance_provision(instance=instance)
    return ScheduleResult([str(j.pk) for j in assigned], [str(i.pk) for i in to_provision], waiting)


def job_send_assignment(*, job: Job) -> None:
    instance = job.instance
    if instance is None or not instance.channel_name:
        return  # the lease runs out and the reconciler re-queues the job
    send_to_channel(instance.channel_name, {"type": "runner.frame", "frame": _assign_frame(job).model_dump_json()})


def job_send_cancel(*, job: Job) -> None:
    instance = job.instance
    if instance is not None and instance.channel_name:
        frame = protocol.CancelJob(job=str(job.pk), reason=job.status_reason)
        send_to_channel(instance.channel_name, {"type": "runner.frame", "frame": frame.model_dump_json()})


def instance_provision(*, instance: Instance) -> None:
    """Start the machine for a new Instance row; a failure is recorded on it."""
    token = secrets.token_urlsafe(32)
    Instance.objects.filter(pk=instance.pk).update(token_hash=hash_token(token))
    try:
        backend_id = get_backend(instance.backend).provision(instance=instance, runner_token=token)
    except BackendError as exc:
        logger.warning("provisioning %s failed: %s", instance.name, exc)
        Instance.objects.filter(pk=instance.pk).update(
            status=InstanceStatus.TERMINATED, status_reason=f"could not start: {exc}", terminated_at=timezone.now()
        )
        return
    Instance.objects.filter(pk=instance.pk).update(backend_id=backend_id)


def instance_terminate(*, instance: Instance, reason: str, status: InstanceStatus = InstanceStatus.TERMINATED) -> None:
    """Mark the instance ended and stop the machine; its active jobs end with ``reason``."""
    changed = (
        Instance.objects.filter(pk=instance.pk)
        .exclude(status__in=[InstanceStatus.TERMINATED, InstanceStatus.LOST])
        .update(status=status, status_reason=reason, terminated_at=timezone.now(), channel_name="")
    )
    for job in Job.objects.filter(instance=instance, status__in=[JobStatus.ASSIGNED, JobStatus.RUNNING]):
        job_finish(job_id=str(job.pk), status=JobStatus.FAILED, exit_code=None, reason=reason)
    for job in Job.objects.filter(instance=instance, status=JobStatus.STOPPING):
        job_finish(job_id=str(job.pk), status=JobStatus.STOPPED, exit_code=None, reason=reason)
    if changed:
        get_backend(instance.backend).terminate(instance=instance)


def instance_retire(*, instance: Instance, reason: str) -> None:
    """An idle runner leaves: told to shut down, then its machine is stopped."""
    if not Instance.objects.filter(pk=instance.pk, status=InstanceStatus.IDLE).update(
        status=InstanceStatus.TERMINATING, status_reason=reason
    ):
        return
    if instance.channel_name:
        frame = protocol.Shutdown(reason=reason).model_dump_json()
        send_to_channel(instance.channel_name, {"type": "runner.frame", "frame": frame})
    instance_terminate(instance=instance, reason=reason)


def requirements_of(job: Job) -> Requirements:
    return Requirements(cpu=job.cpu, memory_bytes=job.memory_bytes, gpu_count=job.gpu_count, gpu_name=job.gpu_name)


# ------------------------------------------------------------------ helpers


def _ready(job: Job) -> bool:
    state = readiness(job)
    if state.doomed:
        job_fail_pending(job_id=str(job.pk), reason=state.reason)
        return False
    if not state.ready:
        _set_waiting_reason(job, state.reason)
    return state.ready


def _reused(job: Job) -> bool:
    """Record the job's cache key; reuse an earlier identical job's result."""
    if not cacheable(spec=job.spec, after_running=job.after_running.exists()):
        return False
    key = job_cache_key(job)
    Job.objects.filter(pk=job.pk).update(cache_key=key)
    if job.run.no_cache:
        return False
    source = find_cached_source(workspace_id=job.workspace_id, key=key, exclude=job.pk)
    return source is not None and job_reuse(job_id=str(job.pk), source=source)


def _claim_runner(job: Job) -> Instance | None:
    req = requirements_of(job)
    query = (
        Instance.objects.select_for_update(skip_locked=True)
        .filter(workspace_id=job.workspace_id, status=InstanceStatus.IDLE)
        .exclude(channel_name="")
        .filter(Q(cpus__gte=req.cpu or 0) & Q(memory_bytes__gte=req.memory_bytes or 0))
        .order_by("idle_since")
    )
    for instance in query[:20]:
        if _gpus_fit(req, instance.gpus):
            return instance
    return None


def _gpus_fit(req: Requirements, gpus: list[dict[str, object]]) -> bool:
    if not req.gpu_count:
        return True
    name = req.gpu_name.lower()
    return sum(1 for g in gpus if name in str(g.get("name", "")).lower()) >= req.gpu_count


def _assign(job: Job, instance: Instance) -> None:
    lease = uuid.uuid4().hex
    expires = timezone.now() + timedelta(seconds=settings.TRAINYARD["LEASE_SECONDS"])
    Job.objects.filter(pk=job.pk, status=JobStatus.PENDING).update(
        status=JobStatus.ASSIGNED,
        instance=instance,
        lease=lease,
        lease_expires_at=expires,
        status_reason=f"assigned to runner {instance.name}",
    )
    Instance.objects.filter(pk=instance.pk).update(status=InstanceStatus.BUSY, idle_since=None)
    job.refresh_from_db()
    run_refresh(run_id=str(job.run_id))


def _wait_or_provision(job: Job, budget: int) -> tuple[str, Instance | None, Instance | None]:
    """(why the job waits, an instance to start, an idle instance to retire)."""
    if not settings.TRAINYARD["LOCAL_BACKEND_ENABLED"]:
        return "waiting for a runner: no backend is configured for this workspace", None, None
    impossible = get_backend(BackendKind.LOCAL).unsatisfiable_reason(requirements_of(job))
    if impossible:
        return f"no backend can run this job: {impossible}", None, None
    ours = Instance.objects.filter(workspace_id=job.workspace_id, backend=BackendKind.LOCAL)
    failed = ours.filter(
        status=InstanceStatus.TERMINATED,
        status_reason__startswith="could not start",
        terminated_at__gte=timezone.now() - timedelta(seconds=PROVISION_RETRY_SECONDS),
    ).first()
    if failed is not None:
        return f"waiting for a runner: {failed.status_reason} (retrying)", None, None
    starting = ours.filter(status=InstanceStatus.PROVISIONING).count()
    waiting_before = Job.objects.filter(
        workspace_id=job.workspace_id, status=JobStatus.PENDING, created_at__lt=job.created_at
    ).count()
    if starting > waiting_before:
        return "waiting for a runner: one is starting", None, None
    if budget <= 0:
        return _pool_full(job)
    instance = Instance.objects.create(
        workspace_id=job.workspace_id,
        backend=BackendKind.LOCAL,
        name=f"local-{uuid.uuid4().hex[:8]}",
        token_hash=f"unset-{uuid.uuid4().hex}",
        status_reason="starting a local runner",
    )
    return "waiting for a runner: starting one", instance, None


def _pool_full(job: Job) -> tuple[str, None, Instance | None]:
    """The local pool is shared by all workspaces: an idle runner of another
    workspace gives its place up (the next pass starts one for this job)."""
    limit = settings.TRAINYARD["LOCAL_RUNNERS_MAX"]
    idle_elsewhere = (
        Instance.objects.select_for_update(skip_locked=True)
        .filter(backend=BackendKind.LOCAL, status=InstanceStatus.IDLE)
        .exclude(workspace_id=job.workspace_id)
        .order_by("idle_since")
        .first()
    )
    if idle_elsewhere is not None:
        return "waiting for a runner: freeing a place in the local pool", None, idle_elsewhere
    return f"waiting for a runner: all {limit} local runners are busy (TRAINYARD_LOCAL_RUNNERS_MAX)", None, None


def _pool_room() -> int:
    live = Instance.objects.filter(backend=BackendKind.LOCAL, status__in=LIVE_STATUSES).count()
    return max(0, settings.TRAINYARD["LOCAL_RUNNERS_MAX"] - live)


def _set_waiting_reason(job: Job, reason: str) -> None:
    if job.status_reason != reason:
        Job.objects.filter(pk=job.pk, status=JobStatus.PENDING).update(status_reason=reason)
        run_refresh(run_id=str(job.run_id))


def _assign_frame(job: Job) -> protocol.AssignJob:
    run: Run = job.run
    spec = job.spec
    env = {
        **secret_env(workspace_id=job.workspace_id),
        **spec["env"],
        **_master_env(job),
        "TRAINYARD_RUN_NAME": run.name,
        "TRAINYARD_JOB_ID": str(job.pk),
        "TRAINYARD_JOB_NAME": job.name,
    }
    return protocol.AssignJob(
        job=str(job.pk),
        lease=job.lease,
        lease_seconds=settings.TRAINYARD["LEASE_SECONDS"],
        run_name=run.name,
        workflow=job.workflow,
        commands=spec["commands"],
        env=env,
        code=_code_spec(run),
        artifacts=[protocol.ArtifactSpec(path=p) for p in spec["artifacts"]],
        api_url=f"{settings.PUBLIC_URL}/api/v1",
        inputs=_inputs(job),
        provider=spec.get("provider", "bash"),
        image=spec.get("image", ""),
    )


def _master_env(job: Job) -> dict[str, str]:
    master = job.after_running.select_related("instance").first()
    if master is None or master.instance is None:
        return {}
    host = master.instance.address or master.instance.hostname or "127.0.0.1"
    port = str(master.ports[0]) if master.ports else ""
    return {"TRAINYARD_MASTER_HOST": host, "TRAINYARD_MASTER_PORT": port}


def _inputs(job: Job) -> list[protocol.InputArtifact]:
    storage = get_storage()
    return [
        protocol.InputArtifact(
            path=i.artifact.path,
            files=[
                protocol.InputFile(
                    path=f.path,
                    size=f.size,
                    sha256=f.sha256,
                    url=storage.signed_url(
                        artifact_file_key(i.artifact, f), method="GET", seconds=DOWNLOAD_URL_SECONDS
                    ),
                )
                for f in i.artifact.files.all()
            ],
        )
        for i in job_inputs(job)
    ]


def _code_spec(run: Run) -> protocol.CodeSpec:
    storage = get_storage()
    if run.code_kind == "archive":
        assert run.archive_blob is not None
        url = storage.signed_url(run.archive_blob.storage_key, method="GET", seconds=DOWNLOAD_URL_SECONDS)
        return protocol.CodeSpec(kind="archive", archive_url=url)
    patch_url = (
        storage.signed_url(run.patch_blob.storage_key, method="GET", seconds=DOWNLOAD_URL_SECONDS)
        if run.patch_blob
        else ""
    )
    return protocol.CodeSpec(kind="git", repo_url=run.repo_url, commit=run.commit, patch_url=patch_url)

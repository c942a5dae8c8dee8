"""Writes for instances that runners make through their websocket."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone
from trainyard_runner import protocol

from backend.accounts.services import hash_token
from backend.clouds.models import Instance, InstanceStatus
from backend.runs.models import ACTIVE_JOB, Job, JobStatus
from backend.runs.services.transitions import job_finish


@dataclass(frozen=True)
class Connected:
    instance: Instance
    previous_channel: str
    welcome: protocol.Welcome


def instance_for_token(*, token: str) -> Instance | None:
    return (
        Instance.objects.filter(token_hash=hash_token(token))
        .exclude(status__in=[InstanceStatus.TERMINATED, InstanceStatus.LOST])
        .first()
    )


def instance_connect(
    *, instance_id: str, hello: protocol.Hello, channel_name: str, heartbeat_seconds: float
) -> Connected:
    """Record the runner's hello and work out what it should resend or drop.

    1. Jobs the runner still runs and we still want: resend logs after our
       watermark. 2. Jobs it runs that ended meanwhile: cancel. 3. Jobs we
       think it runs that it does not know (it restarted): failed.
    """
    now = timezone.now()
    with transaction.atomic():
        instance = Instance.objects.select_for_update().get(pk=instance_id)
        previous = instance.channel_name
        ours = {str(j.pk): j for j in Job.objects.filter(instance=instance, status__in=ACTIVE_JOB)}
        theirs = set(hello.running_jobs)
        acked = {jid: j.last_seq for jid, j in ours.items() if jid in theirs}
        cancel = [jid for jid in theirs if jid not in ours or ours[jid].status == JobStatus.STOPPING]
        lost = [jid for jid, j in ours.items() if jid not in theirs and j.status != JobStatus.ASSIGNED]
        busy = bool(set(acked) - set(cancel))
        Instance.objects.filter(pk=instance.pk).update(
            status=InstanceStatus.BUSY if busy or ours else InstanceStatus.IDLE,
            status_reason="",
            hostname=hello.hostname[:255],
            address=hello.address[:255],
            runner_version=hello.version[:50],
            cpus=hello.resources.cpus,
            memory_bytes=hello.resources.memory_bytes,
            disk_bytes=hello.resources.disk_bytes,
            gpus=[g.model_dump() for g in hello.resources.gpus],
            channel_name=channel_name,
            last_heartbeat_at=now,
            idle_since=None if busy or ours else (instance.idle_since or now),
        )
        # Stopping jobs it still runs: keep their logs flowing until it reports.
        acked.update({jid: ours[jid].last_seq for jid in cancel if jid in ours})
    for jid in lost:
        # A job being stopped counts as stopped; any other is lost work.
        final = JobStatus.STOPPED if ours[jid].status == JobStatus.STOPPING else JobStatus.FAILED
        job_finish(
            job_id=jid,
            status=final,
            exit_code=None,
            reason=f"runner {instance.name} restarted and lost the job",
            instance_id=str(instance.pk),
        )
    if lost:
        instance_job_done(instance_id=str(instance.pk))
    instance.refresh_from_db()
    welcome = protocol.Welcome(
        instance=str(instance.pk), heartbeat_seconds=heartbeat_seconds, acked=acked, cancel=cancel
    )
    return Connected(instance=instance, previous_channel=previous, welcome=welcome)


def instance_disconnect(*, instance_id: str, channel_name: str) -> None:
    Instance.objects.filter(pk=instance_id, channel_name=channel_name).update(channel_name="")


def instance_heartbeat(*, instance_id: str) -> None:
    Instance.objects.filter(pk=instance_id).update(last_heartbeat_at=timezone.now())


def instance_job_done(*, instance_id: str) -> None:
    """The runner finished its job: idle again unless it still has one."""
    if Job.objects.filter(instance_id=instance_id, status__in=ACTIVE_JOB).exists():
        return
    Instance.objects.filter(pk=instance_id, status=InstanceStatus.BUSY).update(
        status=InstanceStatus.IDLE, idle_since=timezone.now()
    )

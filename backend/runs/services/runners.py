"""A runner's (re)connection: what it holds, what we think it holds, and
what each side does about the difference (docs/RUNNER.md, "Reconnecting")."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from trainyard_runner import protocol

from backend.accounts.models import AuditKind
from backend.accounts.services.audit import Actor, audit_record
from backend.clouds.models import BackendKind, Instance, InstanceStatus
from backend.clouds.services.accountpass import unreachable_grace
from backend.clouds.services.identity import instance_identity_problem
from backend.clouds.services.instances import Facts, LiveElsewhere, instance_connected, instance_refusal_for
from backend.core.security import security_event
from backend.runs.lifecycle.transitions import attempt_end, job_accept
from backend.runs.models import LIVE_ATTEMPT, Attempt, AttemptStatus, Job, held_by
from backend.runs.reasons import TerminationReason
from backend.runs.services.reconcile import attempt_end_with_instance


@dataclass(frozen=True)
class Connected:
    instance: Instance | None  # None: refused (see ``refusal`` and ``in_use``)
    previous_channel: str = ""
    welcome: protocol.Welcome | None = None
    refusal: str = ""
    ended: list[str] = field(default_factory=list)  # attempts that ended because of this hello
    # How a refusal closes the socket: the instance ended (fenced), the hello
    # is not from its machine (forbidden), or another connection of the
    # runner is live (in use: the runner may retry once that one is silent).
    close_code: int = protocol.CLOSE_FENCED


def runner_connect(
    *, instance_id: str, hello: protocol.Hello, channel_name: str, heartbeat_seconds: float, address: str = ""
) -> Connected:
    """1. The instance takes the connection, unless it ended (a hello never
    revives a lost or terminated instance; a lost self-hosted machine comes
    back, its old attempts ended first), or the hello is not from the machine
    launched for the token (``instance_identity_problem``), or another
    connection of it is live (refused, a security event; it changes
    nothing). 2. Each attempt the runner holds:
    confirmed when it is still current (its lost acceptance is recorded now),
    refused otherwise (being stopped: cancelled). 3. Attempts we think it runs that it does not hold
    (it restarted): ended, and retried as the reason allows."""
    instance = Instance.objects.filter(pk=instance_id).first()
    if instance is None:
        return Connected(None, refusal="unknown instance")
    cloud = hello.cloud or protocol.CloudIdentity()
    elsewhere = instance_identity_problem(
        instance=instance,
        claimed_id=cloud.instance_id,
        document=cloud.document,
        signature=cloud.signature,
        address=address,
    )
    if elsewhere:
        return Connected(None, refusal=elsewhere, close_code=protocol.CLOSE_FORBIDDEN)
    if instance.backend == BackendKind.SELF_HOSTED and instance.status == InstanceStatus.LOST:
        _fence(instance)  # its identity comes back, its old attempts do not
    previous = instance.channel_name
    ours = {str(a.job_id): a for a in Attempt.objects.filter(instance_id=instance_id, status__in=LIVE_ATTEMPT)}
    held = {h.job: h for h in hello.running_jobs}
    current = {jid: h for jid, h in held.items() if _is_current(ours.get(jid), h)}
    try:
        connected = instance_connected(
            instance_id=instance_id, channel_name=channel_name, facts=_facts(hello), busy=bool(current or ours)
        )
    except LiveElsewhere as live:
        return _in_use(instance, live, address)
    if not connected:
        return Connected(None, refusal=_ended_refusal(instance))
    welcome, ended = _reconcile_held(instance, ours, held, current, heartbeat_seconds)
    instance.refresh_from_db()
    return Connected(instance, previous, welcome, ended=ended)


def _in_use(instance: Instance, live: LiveElsewhere, address: str) -> Connected:
    security_event(
        "runner_connection_refused",
        f"instance {instance.pk} ({instance.name}), workspace {instance.workspace_id}: "
        f"another connection with its token is live ({live}){f' (from {address})' if address else ''}",
    )
    audit_record(
        workspace_id=instance.workspace_id,
        kind=AuditKind.RUNNER,
        action="runner.connection_refused",
        actor=Actor(runner=instance.name, address=address),
        target=instance.name,
        detail={"why": f"another connection with its token is live ({live})"},
    )
    refusal = (
        f"runner {instance.name} is connected and heartbeating elsewhere; retry after {live.window:.0f}s of its silence"
    )
    return Connected(None, refusal=refusal, close_code=protocol.CLOSE_IN_USE)


def _ended_refusal(instance: Instance) -> str:
    """Why the runner must stop, read after the instance ended under the
    hello (a revocation that raced it says so, not "ended (idle)")."""
    instance.refresh_from_db()
    revoked = instance_refusal_for(instance)
    return revoked or f"instance {instance.name} has ended ({instance.status}): this runner must stop"


def _reconcile_held(
    instance: Instance,
    ours: dict[str, Attempt],
    held: dict[str, protocol.HeldJob],
    current: dict[str, protocol.HeldJob],
    heartbeat_seconds: float,
) -> tuple[protocol.Welcome, list[str]]:
    confirmed: list[str] = []
    cancel: list[str] = []
    refused = [jid for jid in held if jid not in current]
    for jid, h in current.items():
        attempt = ours[jid]
        if attempt.status == AttemptStatus.STOPPING:
            cancel.append(jid)
        elif attempt.status == AttemptStatus.RUNNING or job_accept(
            job_id=jid, instance_id=str(instance.pk), attempt=h.attempt, lease=h.lease, ports=h.ports
        ):
            confirmed.append(jid)
        else:
            refused.append(jid)
    acked = _acked(instance, held)
    ended = [str(a.pk) for jid, a in ours.items() if jid not in held]
    for jid, attempt in ours.items():
        if jid not in held:
            _lost_by_runner(instance, attempt)
    welcome = protocol.Welcome(
        instance=str(instance.pk),
        heartbeat_seconds=heartbeat_seconds,
        acked=acked,
        cancel=cancel,
        refused=refused,
        confirmed=confirmed,
        # A self-hosted machine is never terminated by the server: its runner
        # stops its own jobs once cut off past the grace (runner/serverwatch.py).
        unreachable_grace_seconds=unreachable_grace(instance) if instance.backend == BackendKind.SELF_HOSTED else None,
        api_origin=_origin(settings.PUBLIC_URL),
    )
    return welcome, ended


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _acked(instance: Instance, held: dict[str, protocol.HeldJob]) -> dict[str, int]:
    """The stored ``last_seq`` of each held job this runner holds (``held_by``:
    its current attempt runs here, a finished one it still reports included);
    nothing of a job it names and does not hold (moved, another workspace's)."""
    holds = Q(pk__in=[])
    for jid, h in held.items():
        if _is_uuid(jid):
            holds |= Q(pk=jid) & held_by(instance_id=instance.pk, attempt=h.attempt)
    return {str(pk): seq for pk, seq in Job.objects.filter(holds).values_list("pk", "last_seq")}


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _fence(instance: Instance) -> None:
    """A lost self-hosted machine says hello again: every attempt it had ends
    as the reconciler would end it, before the machine is idle again, so what
    the runner still holds is refused (``Welcome.refused``)."""
    for attempt in Attempt.objects.filter(instance_id=instance.pk, status__in=LIVE_ATTEMPT):
        attempt_end_with_instance(attempt=attempt, instance=instance)


def _lost_by_runner(instance: Instance, attempt: Attempt) -> None:
    """The runner came back without an attempt we gave it."""
    if attempt.status == AttemptStatus.ASSIGNED:
        # The assignment never reached it: nothing ran. Give it out again.
        attempt_end(
            attempt_id=str(attempt.pk),
            reason=TerminationReason.REJECTED,
            message=f"runner {instance.name} reconnected without the assignment",
        )
        return
    reason = (
        TerminationReason.STOPPED_BY_USER
        if attempt.status == AttemptStatus.STOPPING
        else TerminationReason.INSTANCE_LOST
    )
    with transaction.atomic():
        attempt_end(
            attempt_id=str(attempt.pk), reason=reason, message=f"runner {instance.name} restarted and lost the job"
        )


def _is_current(attempt: Attempt | None, held: protocol.HeldJob) -> bool:
    return attempt is not None and attempt.number == held.attempt


def _facts(hello: protocol.Hello) -> Facts:
    r = hello.resources
    return Facts(
        hostname=hello.hostname,
        address=hello.address,
        runner_version=hello.version,
        cpus=r.cpus,
        memory_bytes=r.memory_bytes,
        disk_bytes=r.disk_bytes,
        gpus=[g.model_dump() for g in r.gpus],
        cloud_id=hello.cloud.instance_id if hello.cloud else "",
        relay_version=hello.relay,
        ssh_host_key=hello.ssh_host_key,
    )

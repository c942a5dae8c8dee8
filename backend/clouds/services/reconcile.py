"""The clouds' reconciler: what the backends say against what the rows say.

Runs on every reconcile pass (Celery beat). It makes no cloud call itself:
those run in one task per account (``accountpass``), so a slow account
delays nobody else; every status change goes through ``instances``. Steps,
each safe to run twice:

1. Hearing: silence only counts from when the server itself could hear
   (``hearing_since``): not while no web process was alive, nor across a gap
   in the reconciler's own passes (its restart, a database or Redis outage).
2. Launches nobody performed (the task was lost): enqueued again.
   Self-hosted machines are registered, not launched: steps 2, 5 and 7 skip
   them; their account's task presumes their machine is there
   (``SelfHostedCompute``), so a silent one is fenced after the grace, and
   never terminated.
3. Silent runners become unreachable.
4. One ``account_reconcile`` task per account with a call to make: the
   describe of its unreachable (and launched, not yet connected) machines,
   which decides gone or fenced after the grace (every pass); its cloud
   view (every minute); its leak sweep (now and then).
5. Provisioning that never connected within the backend's timeout: terminated.
6. Termination that was not confirmed: asked again.
7. Idle machines past their idle time (their last job's ``idle_duration``,
   else the backend's default): retired.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from backend.clouds.models import (
    IDLE_FOREVER,
    BackendKind,
    CloudAccount,
    ControlPlane,
    Instance,
    InstanceEvent,
    InstanceReason,
    InstanceStatus,
    WebPulse,
)
from backend.clouds.services.accountpass import (
    CLOUD_VIEW_SECONDS,
    LAUNCH_STUCK_SECONDS,
    PULSE_STALE_SECONDS,
    compute_or_none,
    doubtful_instances,
    viewed_instances,
)
from backend.clouds.services.instances import (
    TERMINATE_RECHECK_SECONDS,
    instance_launch_failed,
    instance_mark_unreachable,
    instance_request_termination,
)
from backend.clouds.services.provisioning import launch_offer
from backend.clouds.services.troubles import schedule_timeout
from backend.core.clock import db_now
from backend.core.enqueue import enqueue

logger = logging.getLogger(__name__)

TERMINATE_OVERDUE_SECONDS = 15 * 60.0  # then the workspace and the operator are told


def clouds_reconcile(*, now: datetime | None = None) -> int:
    """One pass; returns how many instances changed in a way that may free or
    need capacity. ``now``: the database's clock, by which every liveness
    stamp was written (``backend.core.clock``), not this worker's."""
    now = now or db_now()
    hearing_since = hearing(now=now)
    changed = 0
    _relaunch_stuck(now)
    if hearing_since is not None:
        changed += _silent_to_unreachable(now, hearing_since)
    _accounts_to_ask(now)
    changed += _provision_timeouts(now)
    _terminations_unconfirmed(now)
    changed += _retire_idle(now)
    return changed


def hearing(*, now: datetime) -> datetime | None:
    """Since when the server could hear runners without a break; None while
    it cannot (no web process alive)."""
    interval = settings.TRAINYARD["RECONCILE_SECONDS"]
    with transaction.atomic():
        state = ControlPlane.objects.select_for_update().order_by("created_at").first()
        if state is None:
            state = ControlPlane.objects.create()
        gap = (now - state.reconciled_at).total_seconds() if state.reconciled_at else None
        deaf = not WebPulse.objects.filter(at__gte=now - timedelta(seconds=PULSE_STALE_SECONDS)).exists()
        broke = gap is None or gap > max(3 * interval, 10.0)
        if deaf or broke or state.hearing_since is None:
            if deaf or broke:
                logger.info("control plane could not hear runners (%s): silence counts from now", _why(deaf, gap))
            state.hearing_since = now
        state.reconciled_at = now
        state.save(update_fields=["reconciled_at", "hearing_since", "updated_at"])
    return None if deaf else state.hearing_since


def web_pulse(*, process: str, now: datetime | None = None) -> None:
    """Called by each web process every few seconds while it serves; stamped
    with the database's clock, as the reconciler reads it."""
    now = now or db_now()
    WebPulse.objects.update_or_create(process=process, defaults={"at": now})
    WebPulse.objects.filter(at__lt=now - timedelta(hours=1)).delete()


# ------------------------------------------------------------------ steps


def _relaunch_stuck(now: datetime) -> None:
    cutoff = now - timedelta(seconds=LAUNCH_STUCK_SECONDS)
    stuck = Instance.objects.filter(
        status=InstanceStatus.PROVISIONING, launched_at=None, created_at__lt=cutoff
    ).exclude(backend=BackendKind.SELF_HOSTED)  # registered, never launched: it waits for its runner
    for instance in stuck[:50]:
        if (now - instance.created_at).total_seconds() > 10 * LAUNCH_STUCK_SECONDS:
            instance_launch_failed(
                instance_id=str(instance.pk),
                reason=InstanceReason.LAUNCH_FAILED,
                message="the launch never happened (no worker took it)",
            )
            continue
        enqueue("backend.clouds.tasks.instance_launch", str(instance.pk))


def _silent_to_unreachable(now: datetime, hearing_since: datetime) -> int:
    timeout = settings.TRAINYARD["HEARTBEAT_TIMEOUT_SECONDS"]
    if now - hearing_since < timedelta(seconds=timeout):
        return 0
    cutoff = now - timedelta(seconds=timeout)
    silent = Instance.objects.filter(
        status__in=[InstanceStatus.IDLE, InstanceStatus.BUSY], last_heartbeat_at__lt=cutoff
    )
    count = 0
    for instance in silent:
        message = f"runner {instance.name} stopped responding (no heartbeat for {timeout:.0f}s)"
        count += instance_mark_unreachable(instance_id=str(instance.pk), message=message)
    return count


def _accounts_to_ask(now: datetime) -> int:
    """One ``account_reconcile`` task per account with a cloud call to make:
    the describe of its doubtful machines (every pass), its cloud view
    (every ``CLOUD_VIEW_SECONDS``) and its leak sweep (every
    ``LEAK_SWEEP_SECONDS``). Each runs in its own task, under its own time
    limit, so a slow or hanging account delays nobody else's detection, and
    this pass (with the lease expiry after it) stays quick. Returns how many
    were queued."""
    view = _due(_accounts_to_ask, "view", CLOUD_VIEW_SECONDS, now)
    sweep = _due(_accounts_to_ask, "sweep", settings.TRAINYARD["LEAK_SWEEP_SECONDS"], now)
    accounts = set(doubtful_instances().values_list("account_id", flat=True))
    if view:
        accounts |= set(viewed_instances(now).values_list("account_id", flat=True))
    if sweep:
        accounts |= set(CloudAccount.objects.values_list("pk", flat=True))
    for account_id in accounts:
        enqueue("backend.clouds.tasks.account_reconcile", str(account_id), view=view, sweep=sweep, after_commit=False)
    return len(accounts)


def _provision_timeouts(now: datetime) -> int:
    count = 0
    launched = Instance.objects.filter(status=InstanceStatus.PROVISIONING).exclude(launched_at=None)
    launched = launched.exclude(backend=BackendKind.SELF_HOSTED)
    for instance in launched.select_related("account"):
        timeout = _timeout(instance)
        if instance.launched_at and now - instance.launched_at > timedelta(seconds=timeout):
            message = f"runner {instance.name} did not connect within {timeout:.0f}s"
            count += instance_request_termination(
                instance_id=str(instance.pk), reason=InstanceReason.PROVISION_TIMEOUT, message=message
            )
    return count


def _terminations_unconfirmed(now: datetime) -> None:
    """Terminate is asked again every 30 s, never given up; after 15 minutes
    the instance says so where the workspace's people look (the Instances
    page, ``trainyard instances``) and the server logs an error."""
    cutoff = now - timedelta(seconds=TERMINATE_RECHECK_SECONDS)
    waiting = Instance.objects.filter(status=InstanceStatus.TERMINATING, terminate_requested_at__lt=cutoff)
    for instance in waiting[:50]:
        Instance.objects.filter(pk=instance.pk).update(terminate_requested_at=now)  # not a status change
        enqueue("backend.clouds.tasks.instance_terminate", str(instance.pk))
        _tell_if_overdue(instance, now)


def _tell_if_overdue(instance: Instance, now: datetime) -> None:
    since = (
        InstanceEvent.objects.filter(instance=instance, to_status=InstanceStatus.TERMINATING)
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    if since is None or now - since < timedelta(seconds=TERMINATE_OVERDUE_SECONDS):
        return
    data = instance.backend_data if isinstance(instance.backend_data, dict) else {}
    if data.get("terminate_overdue"):
        return
    minutes = (now - since).total_seconds() / 60
    message = (
        f"still not terminated after {minutes:.0f} min ({instance.backend_id or 'no cloud id yet'}); "
        "Trainyard keeps trying every 30 s. Check the machine in the cloud console."
    )
    logger.error("instance %s: %s", instance.name, message)
    Instance.objects.filter(pk=instance.pk).update(
        status_reason=message[:500], backend_data={**data, "terminate_overdue": now.isoformat()}
    )


def _retire_idle(now: datetime) -> int:
    """Idle past the backend's idle time (the local pool's: TRAINYARD_LOCAL_RUNNER_IDLE_SECONDS).
    A self-hosted machine is the user's and costs us nothing idle: never retired.
    Nor is one whose runner keeps a job's files (``kept_until``) before their
    time is up: retiring it would destroy them."""
    count = 0
    idle = (
        Instance.objects.filter(status=InstanceStatus.IDLE)
        .exclude(backend=BackendKind.SELF_HOSTED)
        .exclude(kept_until__gt=now)
    )
    for instance in idle.select_related("account"):
        idle_for = _idle_time(instance)
        if idle_for is None or instance.idle_since is None or now - instance.idle_since < timedelta(seconds=idle_for):
            continue
        count += instance_request_termination(
            instance_id=str(instance.pk),
            reason=InstanceReason.IDLE_RETIRED,
            message=f"retired after {idle_for:.0f}s idle",
            only_if_idle=True,
        )
    return count


# ------------------------------------------------------------------ helpers


def _due(holder: object, what: str, every: float, now: datetime) -> bool:
    """True once every ``every`` seconds in this process (the last time kept on ``holder``)."""
    last = getattr(holder, what, None)
    if last is not None and (now - last).total_seconds() < every:
        return False
    setattr(holder, what, now)
    return True


def _idle_time(instance: Instance) -> float | None:
    """Its last job's ``idle_duration`` (None: ``off``, never retired for
    being idle), else the backend's default."""
    if instance.idle_duration is not None:
        return None if instance.idle_duration == IDLE_FOREVER else float(instance.idle_duration)
    if instance.backend == "local":
        return float(settings.TRAINYARD["LOCAL_RUNNER_IDLE_SECONDS"])
    compute = compute_or_none(instance.account) if instance.account else None
    return (
        compute.timings.idle_default if compute is not None else float(settings.TRAINYARD["LOCAL_RUNNER_IDLE_SECONDS"])
    )


def _timeout(instance: Instance) -> float:
    if instance.backend == "local":
        return float(settings.TRAINYARD["PROVISION_TIMEOUT_SECONDS"])
    compute = compute_or_none(instance.account) if instance.account else None
    if compute is None:
        return float(settings.TRAINYARD["PROVISION_TIMEOUT_SECONDS"])
    timeout = compute.provision_timeout_for(launch_offer(instance))
    waits = schedule_timeout(compute)
    # A machine waiting for a node is the schedule timeout's to give up
    # (``troubles``): one placed just before it ran out still gets its boot.
    return max(timeout, waits + compute.timings.provision_timeout) if waits else timeout


def _why(deaf: bool, gap: float | None) -> str:
    if deaf:
        return "no web process alive"
    return "first pass" if gap is None else f"no reconcile pass for {gap:.0f}s"

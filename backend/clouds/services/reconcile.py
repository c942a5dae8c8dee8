"""The clouds' reconciler: what the backends say against what the rows say.

Runs on every reconcile pass (Celery beat). Cloud calls (``describe``,
``list_managed``) happen here, outside any transaction; every status change
goes through ``instances``. Steps, each safe to run twice:

1. Hearing: silence only counts from when the server itself could hear
   (``hearing_since``): not while no web process was alive, nor across a gap
   in the reconciler's own passes (its restart, a database or Redis outage).
2. Launches nobody performed (the task was lost): enqueued again.
   Self-hosted machines are registered, not launched: steps 2, 5 and 7 skip
   them; step 4 presumes their machine is there (``SelfHostedCompute``), so
   a silent one is fenced after the grace, and never terminated.
3. Silent runners become unreachable.
4. Unreachable (and launched, not yet connected) machines: ``describe``
   decides. Gone → lost (or interrupted). Still there → an unreachable one
   keeps its job for the grace, then it is fenced (lost), and terminated.
5. Provisioning that never connected within the backend's timeout: terminated.
6. Termination that was not confirmed: asked again.
7. Idle machines past their idle time (their last job's ``idle_duration``,
   else the backend's default): retired.
8. Now and then, the leak sweep: a machine with our tags and no live row is terminated.
9. Every minute, the cloud's view of each live machine (``cloud_state``),
   recorded for people to see. A machine the cloud says is gone while its
   runner still speaks for it is fenced like a gone silent one (step 4): its
   socket closed, its token refused, its attempts ended. A runner heard
   from a machine that is gone holds a stolen token, or its machine went
   down under it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from backend.clouds.backends.base import GONE, LAUNCHED_AT, CloudState, Compute, Handle
from backend.clouds.backends.errors import ACCOUNT_BROKEN
from backend.clouds.models import (
    IDLE_FOREVER,
    LIVE_STATUSES,
    BackendKind,
    CloudAccount,
    ControlPlane,
    Instance,
    InstanceEvent,
    InstanceReason,
    InstanceStatus,
    WebPulse,
)
from backend.clouds.services.accounts import account_mark_broken, compute_of
from backend.clouds.services.instances import (
    TERMINATE_RECHECK_SECONDS,
    handle_of,
    instance_launch_failed,
    instance_mark_lost,
    instance_mark_unreachable,
    instance_request_termination,
)
from backend.clouds.services.provisioning import launch_offer
from backend.core.clock import db_now
from backend.core.enqueue import enqueue

logger = logging.getLogger(__name__)

# A web process that has not written its pulse for this long is not serving.
PULSE_STALE_SECONDS = 10.0
# A launch task that left no trace for this long is enqueued again.
LAUNCH_STUCK_SECONDS = 30.0
TERMINATE_OVERDUE_SECONDS = 15 * 60.0  # then the workspace and the operator are told
# How often the cloud's view of every live machine is asked for (one call per account).
CLOUD_VIEW_SECONDS = 60.0


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
    changed += _describe_doubtful(now, hearing_since)
    changed += _provision_timeouts(now)
    _terminations_unconfirmed(now)
    changed += _retire_idle(now)
    _leak_sweep(now)
    _cloud_view(now)
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


def _describe_doubtful(now: datetime, hearing_since: datetime | None) -> int:
    """Ask the backends about unreachable machines and launched ones that have
    not said hello yet, one batched describe per account."""
    # An unreachable machine is asked about even if its launch was never
    # recorded (a worker killed mid-launch: its runner connected anyway).
    doubtful = Instance.objects.filter(account__isnull=False).filter(
        Q(status=InstanceStatus.UNREACHABLE) | Q(status=InstanceStatus.PROVISIONING, launched_at__isnull=False)
    )
    changed = 0
    for account, instances in _by_account(doubtful.select_related("account")).items():
        states = _describe(account, instances)
        for instance in instances:
            changed += _judge(instance, states.get(instance.idempotency_key), now, hearing_since)
    return changed


def _judge(instance: Instance, state: CloudState | None, now: datetime, hearing_since: datetime | None) -> int:
    if state in GONE:
        reason = InstanceReason.INTERRUPTED if state == CloudState.INTERRUPTED else InstanceReason.MACHINE_GONE
        words = "was interrupted by the cloud" if state == CloudState.INTERRUPTED else "is gone"
        message = f"machine {instance.name} {words} (the backend says {state})"
        return instance_mark_lost(instance_id=str(instance.pk), reason=reason, message=message)
    if instance.status != InstanceStatus.UNREACHABLE or instance.unreachable_since is None or hearing_since is None:
        return 0
    grace = _grace(instance)
    since = max(instance.unreachable_since, hearing_since)
    if now - since < timedelta(seconds=grace):
        return 0
    message = f"runner {instance.name} unreachable for {grace:.0f}s while its machine is still there: fenced"
    return instance_mark_lost(instance_id=str(instance.pk), reason=InstanceReason.UNREACHABLE_GRACE, message=message)


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
    A self-hosted machine is the user's and costs us nothing idle: never retired."""
    count = 0
    idle = Instance.objects.filter(status=InstanceStatus.IDLE).exclude(backend=BackendKind.SELF_HOSTED)
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


def _cloud_view(now: datetime) -> None:
    """Every ``CLOUD_VIEW_SECONDS``, one batched describe per account of its
    live machines, recorded for the Instances page and ``trainyard
    instances`` (the cloud's view next to ours). A connected machine the
    cloud says is gone is fenced (``_judge``); one that is still there is
    left alone (only a silent runner's is judged on that: ``_describe_doubtful``)."""
    last = getattr(_cloud_view, "last", None)
    if last is not None and (now - last).total_seconds() < CLOUD_VIEW_SECONDS:
        return
    _cloud_view.last = now  # type: ignore[attr-defined]
    stale = now - timedelta(seconds=CLOUD_VIEW_SECONDS)
    live = (
        Instance.objects.filter(account__isnull=False, status__in=[*LIVE_STATUSES, InstanceStatus.TERMINATING])
        .filter(Q(cloud_checked_at__isnull=True) | Q(cloud_checked_at__lt=stale))
        .exclude(backend_id="")
        .select_related("account")
    )
    for account, instances in _by_account(live[:500]).items():
        states = _describe(account, instances)
        for instance in instances:
            state = states.get(instance.idempotency_key)
            if instance.status in (InstanceStatus.IDLE, InstanceStatus.BUSY) and state in GONE:
                _judge(instance, state, now, None)


def _record_cloud_view(instances: list[Instance], states: Mapping[str, CloudState]) -> None:
    now = timezone.now()
    for instance in instances:
        state = states.get(instance.idempotency_key)
        if state is not None:  # not a status change: the cloud's words, kept beside ours
            Instance.objects.filter(pk=instance.pk).update(cloud_state=state.value, cloud_checked_at=now)


def _leak_sweep(now: datetime) -> None:
    """Machines with our tags and no live row: a crash between launch and
    commit, a row deleted by hand. Terminated, and logged loudly."""
    every = settings.TRAINYARD["LEAK_SWEEP_SECONDS"]
    last = getattr(_leak_sweep, "last", None)
    if last is not None and (now - last).total_seconds() < every:
        return
    _leak_sweep.last = now  # type: ignore[attr-defined]
    min_age = settings.TRAINYARD["LEAK_MIN_AGE_SECONDS"]
    for account in CloudAccount.objects.all():
        compute = _compute(account)
        if compute is None:
            continue
        try:
            managed = compute.list_managed()
        except ACCOUNT_BROKEN as error:
            account_mark_broken(account_id=str(account.pk), message=str(error))
            continue
        except Exception:
            logger.warning("leak sweep of account %s failed", account.pk, exc_info=True)
            continue
        live = set(
            Instance.objects.filter(
                account=account, status__in=[*LIVE_STATUSES, InstanceStatus.TERMINATING]
            ).values_list("idempotency_key", flat=True)
        )
        young = now - timedelta(seconds=LAUNCH_STUCK_SECONDS)
        known_young = set(
            Instance.objects.filter(account=account, created_at__gte=young).values_list("idempotency_key", flat=True)
        )
        for handle in managed:
            if handle.key in live or handle.key in known_young or _younger_than(handle, min_age, now):
                continue
            logger.warning("leak sweep: terminating %s (%s), which has no live row", handle.key, handle.backend_id)
            try:
                compute.terminate(handle)
            except Exception:
                logger.warning("leak sweep: terminating %s failed; next sweep tries again", handle.key, exc_info=True)


# ------------------------------------------------------------------ helpers


def _younger_than(handle: Handle, seconds: float, now: datetime) -> bool:
    launched = handle.data.get(LAUNCHED_AT, "")
    try:
        return now.timestamp() - float(launched) < seconds
    except ValueError:
        return False  # the backend does not know: the rows decide


def _by_account(instances: Iterable[Instance]) -> dict[CloudAccount, list[Instance]]:
    grouped: dict[CloudAccount, list[Instance]] = defaultdict(list)
    for instance in instances:
        if instance.account is not None:
            grouped[instance.account].append(instance)
    return grouped


def _describe(account: CloudAccount, instances: list[Instance]) -> dict[str, CloudState]:
    compute = _compute(account)
    if compute is None:
        return {}
    try:
        states = dict(compute.describe([handle_of(i) for i in instances]))
        _record_cloud_view(instances, states)
        return states
    except ACCOUNT_BROKEN as error:  # e.g. a revoked key: not used for launches until fixed
        account_mark_broken(account_id=str(account.pk), message=str(error))
        return {}
    except Exception:  # unknown is not gone: decide nothing this pass
        logger.warning("describe of account %s failed", account.pk, exc_info=True)
        return {}


def _compute(account: CloudAccount) -> Compute | None:
    try:
        return compute_of(account)
    except ACCOUNT_BROKEN as error:  # its configuration cannot work
        account_mark_broken(account_id=str(account.pk), message=str(error))
        return None
    except Exception:
        logger.warning("cannot build the backend of account %s", account.pk, exc_info=True)
        return None


def _grace(instance: Instance) -> float:
    configured = settings.TRAINYARD["UNREACHABLE_GRACE_SECONDS"]
    if configured is not None:
        return float(configured)
    compute = _compute(instance.account) if instance.account else None
    return compute.timings.unreachable_grace if compute is not None else 120.0


def _idle_time(instance: Instance) -> float | None:
    """Its last job's ``idle_duration`` (None: ``off``, never retired for
    being idle), else the backend's default."""
    if instance.idle_duration is not None:
        return None if instance.idle_duration == IDLE_FOREVER else float(instance.idle_duration)
    if instance.backend == "local":
        return float(settings.TRAINYARD["LOCAL_RUNNER_IDLE_SECONDS"])
    compute = _compute(instance.account) if instance.account else None
    return (
        compute.timings.idle_default if compute is not None else float(settings.TRAINYARD["LOCAL_RUNNER_IDLE_SECONDS"])
    )


def _timeout(instance: Instance) -> float:
    if instance.backend == "local":
        return float(settings.TRAINYARD["PROVISION_TIMEOUT_SECONDS"])
    compute = _compute(instance.account) if instance.account else None
    if compute is None:
        return float(settings.TRAINYARD["PROVISION_TIMEOUT_SECONDS"])
    return compute.provision_timeout_for(launch_offer(instance))


def _why(deaf: bool, gap: float | None) -> str:
    if deaf:
        return "no web process alive"
    return "first pass" if gap is None else f"no reconcile pass for {gap:.0f}s"

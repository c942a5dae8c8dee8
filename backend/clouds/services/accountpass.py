"""One cloud account's calls in the reconciler, in a task of their own.

``clouds_reconcile`` (every pass, from beat) queues one
``backend.clouds.tasks.account_reconcile`` per account with something to
ask: every cloud call lives here, so each account runs under its own time
limit and one slow or hanging account delays neither the others nor the
pass that expires leases. Each call is safe to run twice; a Redis lock per
account keeps two of its tasks from running at once (a slow one and the
next pass's), and the later one simply does nothing.

1. Describe (every pass): the account's unreachable machines and launched
   ones that have not said hello, in one batched call (``Compute.view``:
   the states with the cloud's reasons). Gone → lost (or interrupted), with
   the cloud's words. A launched one the cloud says cannot be scheduled or
   cannot pull its image is given up, or says why it waits (``troubles``).
   Still there → an unreachable one keeps its job for the grace (counted
   only while the server could hear), then it is fenced.
2. The cloud's view (``view``, every ``CLOUD_VIEW_SECONDS``): one batched
   view of its live machines, recorded for people to see. A machine the
   cloud says is gone while its runner still speaks for it is fenced like a
   gone silent one (step 1): its socket closed, its token refused, its
   attempts ended. A runner heard from a machine that is gone holds a stolen
   token, or its machine went down under it.
3. The leak sweep (``sweep``, every ``LEAK_SWEEP_SECONDS``): a machine with
   our tags and no live row is terminated.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.db.models.functions import Now

from backend.clouds.backends.base import GONE, LAUNCHED_AT, Compute, Handle, MachineView
from backend.clouds.backends.errors import ACCOUNT_BROKEN
from backend.clouds.models import (
    LIVE_STATUSES,
    CloudAccount,
    ControlPlane,
    Instance,
    InstanceReason,
    InstanceStatus,
    WebPulse,
)
from backend.clouds.services.accounts import account_mark_broken, compute_of
from backend.clouds.services.instances import handle_of, instance_mark_lost
from backend.clouds.services.troubles import machine_gone, machine_troubled
from backend.core.clock import db_now
from backend.core.redis import redis_client

logger = logging.getLogger(__name__)

# A web process that has not written its pulse for this long is not serving.
PULSE_STALE_SECONDS = 10.0
# A launch task that left no trace for this long is enqueued again (and a
# machine younger than that is never a leak).
LAUNCH_STUCK_SECONDS = 30.0
# How often the cloud's view of every live machine is asked for (one call per account).
CLOUD_VIEW_SECONDS = 60.0
# The task's own time limit (backend/clouds/tasks.py), and its lock's lifetime.
ACCOUNT_TASK_SECONDS = 120


def doubtful_instances() -> QuerySet[Instance]:
    """Machines only the cloud can say anything about: unreachable ones (even
    one whose launch was never recorded: a worker killed mid-launch whose
    runner connected anyway) and launched ones that have not said hello."""
    return Instance.objects.filter(account__isnull=False).filter(
        Q(status=InstanceStatus.UNREACHABLE) | Q(status=InstanceStatus.PROVISIONING, launched_at__isnull=False)
    )


def viewed_instances(now: datetime) -> QuerySet[Instance]:
    """Live machines whose cloud view is older than ``CLOUD_VIEW_SECONDS``."""
    stale = now - timedelta(seconds=CLOUD_VIEW_SECONDS)
    return (
        Instance.objects.filter(account__isnull=False, status__in=[*LIVE_STATUSES, InstanceStatus.TERMINATING])
        .filter(Q(cloud_checked_at__isnull=True) | Q(cloud_checked_at__lt=stale))
        .exclude(backend_id="")
    )


def account_reconcile(*, account_id: str, view: bool = False, sweep: bool = False) -> int:
    """The account's cloud calls (the module's steps); returns how many
    machines changed in a way that may free or need capacity. Nothing when
    another task of the account is still at it."""
    account = CloudAccount.objects.filter(pk=account_id).first()
    if account is None:
        return 0
    lock = f"clouds:account-reconcile:{account_id}"
    if not redis_client().set(lock, "1", nx=True, ex=ACCOUNT_TASK_SECONDS):
        logger.info("account %s: its previous reconcile task is still running; this one does nothing", account_id)
        return 0
    try:
        changed = _describe_doubtful(account)
        if view:
            changed += _cloud_view(account)
        if sweep:
            _leak_sweep(account)
        return changed
    finally:
        redis_client().delete(lock)


def hearing_now(now: datetime) -> datetime | None:
    """Since when the server has heard runners without a break (as the last
    pass recorded it); None while no web process is alive."""
    if not WebPulse.objects.filter(at__gte=now - timedelta(seconds=PULSE_STALE_SECONDS)).exists():
        return None
    return ControlPlane.objects.order_by("created_at").values_list("hearing_since", flat=True).first()


def _describe_doubtful(account: CloudAccount) -> int:
    instances = list(doubtful_instances().filter(account=account).select_related("account"))
    if not instances:
        return 0
    compute = compute_or_none(account)
    views = _view(account, compute, instances) if compute is not None else {}
    now = db_now()  # after the call: the grace is counted to when its answer came
    hearing_since = hearing_now(now)
    changed = 0
    for instance in instances:
        view = views.get(instance.idempotency_key)
        seen = view is not None and view.state not in GONE
        if compute is not None and view is not None and seen and machine_troubled(instance, view, compute, now):
            changed += 1
            continue
        changed += _judge(instance, view, now, hearing_since)
    return changed


def _cloud_view(account: CloudAccount) -> int:
    """The cloud's view of the account's live machines; a connected one the
    cloud says is gone is fenced (``_judge``); one still there is left alone
    (only a silent runner's is judged on that: ``_describe_doubtful``)."""
    instances = list(viewed_instances(db_now()).filter(account=account).select_related("account")[:500])
    if not instances:
        return 0
    compute = compute_or_none(account)
    if compute is None:
        return 0
    views = _view(account, compute, instances)
    now = db_now()
    return sum(
        _judge(i, view, now, None)
        for i in instances
        if i.status in (InstanceStatus.IDLE, InstanceStatus.BUSY)
        and (view := views.get(i.idempotency_key)) is not None
        and view.state in GONE
    )


def _leak_sweep(account: CloudAccount) -> None:
    """Machines with our tags and no live row: a crash between launch and
    commit, a row deleted by hand. Terminated, and logged loudly."""
    compute = compute_or_none(account)
    if compute is None:
        return
    try:
        managed = compute.list_managed()
    except ACCOUNT_BROKEN as error:
        account_mark_broken(account_id=str(account.pk), message=str(error))
        return
    except Exception:
        logger.warning("leak sweep of account %s failed", account.pk, exc_info=True)
        return
    now = db_now()
    live = set(
        Instance.objects.filter(account=account, status__in=[*LIVE_STATUSES, InstanceStatus.TERMINATING]).values_list(
            "idempotency_key", flat=True
        )
    )
    young = now - timedelta(seconds=LAUNCH_STUCK_SECONDS)
    known_young = set(
        Instance.objects.filter(account=account, created_at__gte=young).values_list("idempotency_key", flat=True)
    )
    min_age = settings.TRAINYARD["LEAK_MIN_AGE_SECONDS"]
    for handle in managed:
        if handle.key in live or handle.key in known_young or _younger_than(handle, min_age, now):
            continue
        logger.warning("leak sweep: terminating %s (%s), which has no live row", handle.key, handle.backend_id)
        try:
            compute.terminate(handle)
        except Exception:
            logger.warning("leak sweep: terminating %s failed; next sweep tries again", handle.key, exc_info=True)


def _view(account: CloudAccount, compute: Compute, instances: list[Instance]) -> dict[str, MachineView]:
    try:
        views = dict(compute.view([handle_of(i) for i in instances]))
        _record_cloud_view(instances, views)
        return views
    except ACCOUNT_BROKEN as error:  # e.g. a revoked key: not used for launches until fixed
        account_mark_broken(account_id=str(account.pk), message=str(error))
        return {}
    except Exception:  # unknown is not gone: decide nothing this pass
        logger.warning("describe of account %s failed", account.pk, exc_info=True)
        return {}


def _record_cloud_view(instances: list[Instance], views: Mapping[str, MachineView]) -> None:
    for instance in instances:
        view = views.get(instance.idempotency_key)
        if view is not None:  # not a status change: the cloud's words, kept beside ours
            Instance.objects.filter(pk=instance.pk).update(cloud_state=view.state.value, cloud_checked_at=Now())


def _judge(instance: Instance, view: MachineView | None, now: datetime, hearing_since: datetime | None) -> int:
    if view is not None and view.state in GONE:
        return machine_gone(instance, view)
    if instance.status != InstanceStatus.UNREACHABLE or instance.unreachable_since is None or hearing_since is None:
        return 0
    grace = unreachable_grace(instance)
    since = max(instance.unreachable_since, hearing_since)
    if now - since < timedelta(seconds=grace):
        return 0
    message = f"runner {instance.name} unreachable for {grace:.0f}s while its machine is still there: fenced"
    return instance_mark_lost(instance_id=str(instance.pk), reason=InstanceReason.UNREACHABLE_GRACE, message=message)


def unreachable_grace(instance: Instance) -> float:
    """How long an unreachable runner keeps its job before it is fenced (its
    runner stops the job itself after as long without the server)."""
    configured = settings.TRAINYARD["UNREACHABLE_GRACE_SECONDS"]
    if configured is not None:
        return float(configured)
    compute = compute_or_none(instance.account) if instance.account else None
    return compute.timings.unreachable_grace if compute is not None else 120.0


def compute_or_none(account: CloudAccount) -> Compute | None:
    """The account's backend; None (logged, or the account marked broken) when it cannot be built."""
    try:
        return compute_of(account)
    except ACCOUNT_BROKEN as error:  # its configuration cannot work
        account_mark_broken(account_id=str(account.pk), message=str(error))
        return None
    except Exception:
        logger.warning("cannot build the backend of account %s", account.pk, exc_info=True)
        return None


def _younger_than(handle: Handle, seconds: float, now: datetime) -> bool:
    launched = handle.data.get(LAUNCHED_AT, "")
    try:
        return now.timestamp() - float(launched) < seconds
    except ValueError:
        return False  # the backend does not know: the rows decide

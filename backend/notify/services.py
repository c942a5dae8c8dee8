"""Notifications: which subscriptions hear an event, and each delivery's
life (docs/COST.md, "Notifications").

1. ``notify_event`` is the one way anything emits an event. Its deliveries
   are recorded once the caller's transaction commits (a rolled-back change
   tells no one), one per enabled subscription that chose the event (a
   member's own subscription: only for runs they submitted), and each is
   queued by name (``backend.core.enqueue``).
2. ``delivery_send`` claims a due pending delivery (``next_at`` moved past
   the send task's time limits, so a worker that dies mid-send leaves it to
   the sweep, and a slow send is not swept while it runs), sends it outside any transaction, and records what happened.
3. A failure is retried after ``TRAINYARD_NOTIFY_RETRY_SECONDS``, 4 times
   longer each time (at most an hour), until ``TRAINYARD_NOTIFY_RETRY_HOURS``
   after the event; then the delivery is failed.
4. A subscription none of whose deliveries got through for
   ``TRAINYARD_NOTIFY_DISABLE_AFTER_DAYS`` is disabled, saying why (with its
   last error), with an audit entry and an email to each of the workspace's
   admins who has an address. One that gets through is failing no more.
5. ``deliveries_sweep`` (beat) queues the pending deliveries that are due.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from backend.accounts.models import AuditKind, Membership, Role, User, Workspace
from backend.accounts.services.audit import Actor, audit_record
from backend.core.enqueue import enqueue
from backend.core.errors import ApplicationError
from backend.notify.models import (
    EVENTS,
    TEST_EVENT,
    Delivery,
    DeliveryStatus,
    Kind,
    Scope,
    Subscription,
)
from backend.notify.senders import (
    Message,
    SendError,
    send_disabled_notice,
    send_email,
    send_slack,
    send_webhook,
    target_address,
)
from backend.notify.signing import secret_new
from backend.runs.models import Run
from backend.vault.crypto import decrypt, encrypt

logger = logging.getLogger(__name__)

# How many due deliveries one sweep queues (the next sweep takes the rest).
SWEEP_BATCH = 500
MAX_RETRY_WAIT = timedelta(hours=1)
# The most one send may take: its task's soft time limit (the hard one is 30 s
# later). A claimed delivery is not swept back to the queue before both have
# passed, so a slow receiver is never sent the same delivery twice at once.
SEND_TIME_LIMIT = 120
CLAIM_LEASE = timedelta(seconds=SEND_TIME_LIMIT + 60)
TARGET_MAX = 500
DISABLED_REASON_MAX = 300  # Subscription.disabled_reason's length
# A workspace's subscriptions, all kinds and scopes: each event is one delivery per subscription.
SUBSCRIPTIONS_MAX = 50
_SLACK_URL = re.compile(r"https://hooks\.slack\.com/.+")


@dataclass(frozen=True)
class Created:
    """A new subscription, and its webhook secret: the only time it is shown."""

    subscription: Subscription
    secret: str


# ------------------------------------------------------------------- events


def notify_event(*, workspace_id: UUID | str, type: str, data: dict[str, Any]) -> None:
    """Tell the workspace's subscriptions to ``type`` once the caller's
    transaction commits. ``data["run"]["id"]``, when there, names the run
    (a member's own subscription hears only the runs they submitted)."""
    if type not in EVENTS:
        raise ValueError(f"unknown event {type!r}: one of {', '.join(EVENTS)}")
    transaction.on_commit(partial(_record_event, str(workspace_id), type, data))


def _record_event(workspace_id: str, type: str, data: dict[str, Any]) -> None:
    try:
        deliveries_record(workspace_id=workspace_id, type=type, data=data)
    except Exception:  # the change it tells of has committed: a lost notice is logged, never raised into it
        logger.exception("could not record the %s deliveries of workspace %s", type, workspace_id)


def deliveries_record(*, workspace_id: str, type: str, data: dict[str, Any]) -> list[Delivery]:
    """One pending delivery per subscription that hears this event, each
    queued. A member's own subscription hears the runs they submitted while
    they are a member of the workspace."""
    subscriptions = list(Subscription.objects.filter(workspace_id=workspace_id, enabled=True, events__contains=[type]))
    run_id = (data.get("run") or {}).get("id")
    submitter = Run.objects.filter(pk=run_id).values_list("submitted_by_id", flat=True).first() if run_id else None
    member = submitter is not None and Membership.objects.filter(workspace_id=workspace_id, user_id=submitter).exists()
    hearing = [s for s in subscriptions if s.scope == Scope.WORKSPACE or (member and s.created_by_id == submitter)]
    if not hearing:
        return []
    payload = _payload(workspace_id, type, data)
    with transaction.atomic():
        deliveries = [_delivery(s, payload) for s in hearing]
        Delivery.objects.bulk_create(deliveries)
        for delivery in deliveries:
            enqueue("backend.notify.tasks.delivery_send", str(delivery.pk))
    return deliveries


def _payload(workspace_id: str, type: str, data: dict[str, Any]) -> dict[str, Any]:
    slug = Workspace.objects.filter(pk=workspace_id).values_list("slug", flat=True).first() or ""
    return {
        "id": str(uuid.uuid4()),
        "type": type,
        "created_at": timezone.now().isoformat(),
        "workspace": slug,
        "data": data,
    }


def _delivery(subscription: Subscription, payload: dict[str, Any]) -> Delivery:
    return Delivery(
        workspace_id=subscription.workspace_id,
        subscription=subscription,
        event_id=payload["id"],
        event_type=payload["type"],
        payload=payload,
        next_at=timezone.now(),
    )


# ------------------------------------------------------------ subscriptions


def subscription_create(
    *, workspace: Workspace, user: User, kind: str, target: str, events: list[str], scope: str
) -> Created:
    """A new subscription; a webhook's secret is made here and returned once
    (stored encrypted). The target is checked as a send would check it."""
    kind = Kind(kind)
    target = _target_clean(kind, target)
    events = _events_clean(events)
    if Subscription.objects.filter(workspace=workspace).count() >= SUBSCRIPTIONS_MAX:
        raise ApplicationError(
            f"{workspace.slug} has {SUBSCRIPTIONS_MAX} notification subscriptions, the most a workspace may have: "
            "remove one (trainyard notify rm) or add events to an existing one",
            status_code=409,
        )
    secret = secret_new() if kind == Kind.WEBHOOK else ""
    subscription = Subscription.objects.create(
        workspace=workspace,
        created_by=user,
        kind=kind,
        scope=Scope(scope),
        target=target,
        events=events,
        secret_ciphertext=encrypt(secret) if secret else b"",
    )
    return Created(subscription, secret)


def subscription_update(
    *, subscription: Subscription, events: list[str] | None = None, enabled: bool | None = None
) -> Subscription:
    """Change what it hears, or enable/disable it (enabling it again forgets its failures)."""
    updates: dict[str, Any] = {}
    if events is not None:
        updates["events"] = _events_clean(events)
    if enabled is not None:
        updates["enabled"] = enabled
        if enabled:
            updates.update(failing_since=None, disabled_reason="")
    for field, value in updates.items():
        setattr(subscription, field, value)
    if updates:
        subscription.save(update_fields=[*updates, "updated_at"])
    return subscription


def subscription_delete(*, subscription: Subscription) -> None:
    subscription.delete()


def subscription_test(*, subscription: Subscription) -> Delivery:
    """A ``test`` event for this subscription alone, sent like any other."""
    payload = _payload(str(subscription.workspace_id), TEST_EVENT, {"subscription": str(subscription.pk)})
    with transaction.atomic():
        delivery = _delivery(subscription, payload)
        delivery.save()
        enqueue("backend.notify.tasks.delivery_send", str(delivery.pk))
    return delivery


def _target_clean(kind: Kind, target: str) -> str:
    target = target.strip()
    if not target or len(target) > TARGET_MAX:
        raise ApplicationError(f"the target must be 1 to {TARGET_MAX} characters", extra={"field": "target"})
    if kind == Kind.EMAIL:
        return _email_clean(target)
    if kind == Kind.SLACK and not _SLACK_URL.fullmatch(target) and not target.startswith(("http://", "https://")):
        raise ApplicationError(
            f"{target} is not a Slack incoming webhook URL (https://hooks.slack.com/services/…)",
            extra={"field": "target"},
        )
    try:
        target_address(target)
    except SendError as e:
        raise ApplicationError(str(e), extra={"field": "target"}) from None
    return target


def _email_clean(target: str) -> str:
    try:
        validate_email(target)
    except ValidationError:
        raise ApplicationError(f"{target} is not an email address", extra={"field": "target"}) from None
    if not settings.EMAIL_HOST:
        raise ApplicationError(
            'this installation sends no email: its operator sets TRAINYARD_EMAIL_HOST (docs/CONFIGURATION.md, "Email")',
            extra={"field": "kind"},
        )
    return target


def _events_clean(events: list[str]) -> list[str]:
    unknown = [e for e in events if e not in EVENTS]
    if unknown or not events:
        raise ApplicationError(
            f"events must be one or more of {', '.join(EVENTS)}" + (f"; not {', '.join(unknown)}" if unknown else ""),
            extra={"field": "events"},
        )
    return sorted(set(events), key=EVENTS.index)


# --------------------------------------------------------------- deliveries


def delivery_send(*, delivery_id: str) -> str:
    """Send one due pending delivery (module docstring, steps 2–4); its
    status afterwards ("" when it was not due or not pending)."""
    delivery = _claim(delivery_id)
    if delivery is None:
        return ""
    subscription = delivery.subscription
    if not subscription.enabled:
        _finish(delivery, status=DeliveryStatus.FAILED, error="the subscription is disabled")
        return DeliveryStatus.FAILED
    try:
        code = _send(subscription, delivery)
    except SendError as e:
        return _failed(delivery, str(e), e.status_code)
    _finish(delivery, status=DeliveryStatus.DELIVERED, code=code)
    Subscription.objects.filter(pk=subscription.pk).exclude(failing_since=None).update(failing_since=None)
    return DeliveryStatus.DELIVERED


def deliveries_sweep() -> int:
    """Queue the pending deliveries that are due; how many."""
    due = Delivery.objects.filter(status=DeliveryStatus.PENDING, next_at__lte=timezone.now()).order_by("next_at")
    ids = [str(pk) for pk in due.values_list("pk", flat=True)[:SWEEP_BATCH]]
    for delivery_id in ids:
        enqueue("backend.notify.tasks.delivery_send", delivery_id, after_commit=False)
    return len(ids)


def retry_wait(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failed try."""
    first = settings.TRAINYARD["NOTIFY_RETRY_SECONDS"]
    return min(timedelta(seconds=first * 4 ** max(attempts - 1, 0)), MAX_RETRY_WAIT)


def _claim(delivery_id: str) -> Delivery | None:
    now = timezone.now()
    with transaction.atomic():
        delivery = (
            Delivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("subscription")
            .filter(pk=delivery_id, status=DeliveryStatus.PENDING, next_at__lte=now)
            .first()
        )
        if delivery is None:
            return None
        Delivery.objects.filter(pk=delivery.pk).update(next_at=now + CLAIM_LEASE, attempts=F("attempts") + 1)
    delivery.attempts += 1
    return delivery


def _send(subscription: Subscription, delivery: Delivery) -> int | None:
    message = Message(str(delivery.pk), delivery.event_type, delivery.payload)
    if subscription.kind == Kind.WEBHOOK:
        secret = decrypt(subscription.secret_ciphertext)
        return send_webhook(url=subscription.target, secret=secret, message=message)
    if subscription.kind == Kind.SLACK:
        return send_slack(url=subscription.target, message=message)
    send_email(address=subscription.target, message=message)
    return None


def _failed(delivery: Delivery, error: str, code: int | None) -> str:
    now = timezone.now()
    next_at = now + retry_wait(delivery.attempts)
    give_up = next_at > delivery.created_at + timedelta(hours=settings.TRAINYARD["NOTIFY_RETRY_HOURS"])
    status = DeliveryStatus.FAILED if give_up else DeliveryStatus.PENDING
    _finish(delivery, status=status, code=code, error=error, next_at=None if give_up else next_at)
    _subscription_failing(delivery.subscription, now, error)
    return status


def _finish(
    delivery: Delivery,
    *,
    status: DeliveryStatus,
    code: int | None = None,
    error: str = "",
    next_at: datetime | None = None,
) -> None:
    Delivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING).update(
        status=status,
        last_status_code=code,
        last_error=error[:500],
        next_at=next_at,
        delivered_at=timezone.now() if status == DeliveryStatus.DELIVERED else None,
    )


def _subscription_failing(subscription: Subscription, now: datetime, error: str) -> None:
    """Note since when it fails; past ``TRAINYARD_NOTIFY_DISABLE_AFTER_DAYS``,
    disable it (once: the update that disables it is the one that tells)."""
    Subscription.objects.filter(pk=subscription.pk, failing_since=None).update(failing_since=now)
    days = settings.TRAINYARD["NOTIFY_DISABLE_AFTER_DAYS"]
    since = now - timedelta(days=days)
    reason = disabled_reason(days, error)
    with transaction.atomic():
        if not Subscription.objects.filter(pk=subscription.pk, enabled=True, failing_since__lte=since).update(
            enabled=False, disabled_reason=reason
        ):
            return
        Delivery.objects.filter(subscription_id=subscription.pk, status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.FAILED, next_at=None, last_error="the subscription was disabled"
        )
        audit_record(
            workspace_id=subscription.workspace_id,
            kind=AuditKind.WORKSPACE,
            action="workspace.notification_disabled",
            actor=Actor(),
            target=f"{subscription.kind} {subscription.target}",
            detail={"subscription": str(subscription.pk), "reason": reason},
        )
        enqueue("backend.notify.tasks.disabled_notice_send", str(subscription.pk))


def disabled_reason(days: float, error: str) -> str:
    """Why a failing subscription was disabled, as shown on it (at most its field's 300 characters)."""
    head = f"disabled: no delivery got through for {days:g} days"
    last = f"; the last: {' '.join(error.split())}" if error else ""
    tail = "; enable it again once the receiver is fixed"
    room = DISABLED_REASON_MAX - len(head) - len(tail)
    return head + (last if len(last) <= room else last[: room - 1] + "…") + tail


def disabled_notice_send(*, subscription_id: str) -> int:
    """Email the workspace's admins who have an address that this
    subscription was disabled; how many were sent (0 when the installation
    sends no email, or the subscription was enabled again meanwhile). The
    audit entry is the record; a failed email is logged, not retried."""
    subscription = Subscription.objects.select_related("workspace").filter(pk=subscription_id, enabled=False).first()
    if subscription is None or not settings.EMAIL_HOST:
        return 0
    admins = (
        Membership.objects.filter(workspace_id=subscription.workspace_id, role=Role.ADMIN)
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )
    sent = 0
    for address in sorted(set(admins)):
        try:
            send_disabled_notice(address=address, subscription=subscription)
        except SendError:
            logger.warning(
                "could not tell %s that subscription %s was disabled", address, subscription.pk, exc_info=True
            )
        else:
            sent += 1
    return sent

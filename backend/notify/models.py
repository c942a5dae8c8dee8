"""Who is told what about a workspace's runs, and each telling.

A ``Subscription`` sends the events it names to one target: a webhook URL
(each body signed with the subscription's secret, stored encrypted by
``backend.vault.crypto`` and shown once, when it is made), a Slack incoming
webhook URL, or an email address. A workspace subscription (made by an
admin) hears every run; a member's own (``scope=mine``) hears only the runs
its maker submitted.

A ``Delivery`` is one event for one subscription: recorded when the event's
transaction commits, sent by a task, retried with backoff until it is
delivered or a day has passed (``services``).
"""

from __future__ import annotations

from django.db import models

from backend.accounts.models import User, WorkspaceOwnedModel

# Every event a subscription may choose. The budget events are accepted now
# and emitted by the budgets.
EVENTS = (
    "run.succeeded",
    "run.failed",
    "run.stopped",
    "attempt.interrupted",
    "attempt.resumed",
    "job.waiting_capacity",
    "guard.fired",
    "budget.80",
    "budget.100",
)
# The synthetic event of "send test".
TEST_EVENT = "test"


class Kind(models.TextChoices):
    WEBHOOK = "webhook"
    SLACK = "slack"
    EMAIL = "email"


class Scope(models.TextChoices):
    WORKSPACE = "workspace"  # every run of the workspace (admins)
    MINE = "mine"  # the runs its maker submitted


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class Subscription(WorkspaceOwnedModel):
    created_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.WORKSPACE)
    target = models.CharField(max_length=500)  # the URL, or the email address
    secret_ciphertext = models.BinaryField(blank=True, default=b"")  # webhooks only
    events = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)
    # Since when every delivery has failed (None: the last one got through).
    failing_since = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        indexes = [models.Index(fields=["workspace", "enabled"], name="notify_sub_enabled")]

    def __str__(self) -> str:
        return f"{self.kind} {self.target}"


class Delivery(WorkspaceOwnedModel):
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.UUIDField()
    event_type = models.CharField(max_length=40)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    # When a pending delivery is next tried; while a worker sends it, when
    # the sweep may take it back (its worker died).
    next_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["subscription", "event_id"], name="uniq_notify_delivery_event"),
        ]
        indexes = [
            # The sweep: pending deliveries that are due.
            models.Index(fields=["next_at"], name="notify_delivery_due", condition=models.Q(status="pending")),
            models.Index(fields=["subscription", "-created_at"], name="notify_delivery_log"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} → {self.subscription_id} ({self.status})"

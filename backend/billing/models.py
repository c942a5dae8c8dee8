"""Budgets (docs/COST.md, "Budgets and quotas").

A ``Budget`` caps spending per calendar month (UTC): the workspace's own
(``user`` null) or one member's in the workspace; a member's may also cap
the GPUs their running jobs hold at once (``gpu_quota``). Amounts are USD.
Only a workspace's admins set them (``services``), each change audited.

A ``BudgetAlert`` records that a budget crossed a threshold in a month
(``warn_percent`` or 100), so each is told once a month.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from backend.accounts.models import User, WorkspaceOwnedModel

# A limit above this is a typo, not a budget (and fits the column).
MAX_AMOUNT = 10_000_000


class Budget(WorkspaceOwnedModel):
    user = models.ForeignKey(User, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    monthly_limit = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)  # None: no cap
    gpu_quota = models.PositiveIntegerField(null=True, blank=True)  # a member's running GPUs; None: no quota
    warn_percent = models.PositiveSmallIntegerField(default=80)
    updated_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace"], condition=Q(user__isnull=True), name="budget_one_workspace"),
            models.UniqueConstraint(
                fields=["workspace", "user"], condition=Q(user__isnull=False), name="budget_one_per_member"
            ),
        ]


class BudgetAlert(WorkspaceOwnedModel):
    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    period = models.DateField()  # the month's first day (UTC)
    level = models.PositiveSmallIntegerField()  # warn_percent, or 100

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["budget", "period", "level"], name="budget_alert_once"),
        ]


class CostDay(models.Model):
    """The rollup (``backend.billing.rollup``): the settled costs of one UTC
    day of a workspace, per submitter, workflow and backend — ``kind`` "a"
    the attempts that started that day, "i" the idle share of the machines
    that started running that day. Written only by the database's triggers
    (and the rebuild); ``first_at``/``last_at`` bound the starts it counted."""

    workspace_id = models.UUIDField()
    day = models.DateField()
    kind = models.CharField(max_length=1)
    user_id = models.BigIntegerField()  # the run's submitter; 0: none
    workflow = models.CharField(max_length=200)
    backend = models.CharField(max_length=32)
    cost = models.DecimalField(max_digits=20, decimal_places=4)
    items = models.IntegerField()  # attempts, or machines
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workspace_id", "day", "kind", "user_id", "workflow", "backend"], name="billing_costday_key"
            ),
        ]


class MachineIdle(models.Model):
    """A terminated machine's settled idle share (its cost less its
    attempts'), as counted in its ``CostDay`` bucket: written only by the
    database's triggers (and the rebuild)."""

    instance_id = models.UUIDField(primary_key=True)
    workspace_id = models.UUIDField()
    backend = models.CharField(max_length=32)
    running_at = models.DateTimeField()
    idle = models.DecimalField(max_digits=20, decimal_places=4)

    class Meta:
        indexes = [models.Index(fields=["workspace_id", "running_at"], name="billing_idle_ws_running")]

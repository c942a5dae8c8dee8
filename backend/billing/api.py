"""REST: the workspace's costs over a window, grouped, and its budgets
(docs/API.md, docs/COST.md). Members and viewers read them; admins set
and remove budgets."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.auth import signed_in_user
from backend.accounts.models import Membership, Role, User
from backend.accounts.services.audit import Actor
from backend.accounts.tenancy import WorkspaceAPIView
from backend.billing.selectors import KEYS, BudgetShown, Key, budgets_shown, cost_report, month_start, shown
from backend.billing.services import budget_remove, budget_set
from backend.core.errors import ApplicationError, NotFound
from backend.core.ratelimit import client_ip

MAX_WINDOW_DAYS = 400
_RELATIVE = re.compile(r"^(\d{1,3})([dh])$")


class CostRowOut(serializers.Serializer):
    key = serializers.CharField(
        help_text="the user, workflow, backend, UTC day (YYYY-MM-DD), week (its Monday, YYYY-MM-DD) or month (YYYY-MM)"
    )
    cost = serializers.CharField(help_text="USD, a decimal string")


class CostReportOut(serializers.Serializer):
    currency = serializers.CharField(help_text='always "USD"')
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    by = serializers.ChoiceField(choices=list(KEYS))
    total = serializers.CharField(help_text="USD: the rows' sum and the idle line")
    idle = serializers.CharField(
        help_text="USD: what the machines that started in the window cost while no job held them"
    )
    rows = CostRowOut(many=True, help_text="the costliest first (by day, week or month: in date order)")


class CostReportView(WorkspaceAPIView):
    """What the workspace spent in [since, until): attempts that started
    then, grouped by user, workflow, backend, day, week or month, and the
    idle line."""

    @extend_schema(
        responses=CostReportOut,
        parameters=[
            OpenApiParameter(
                "since", str, description="ISO date or time, or 30d / 12h ago (default: the month's start, UTC)"
            ),
            OpenApiParameter("until", str, description="ISO date or time, or 7d / 12h ago (default: now)"),
            OpenApiParameter("by", str, enum=list(KEYS), description="how rows are grouped (default: user)"),
        ],
    )
    def get(self, request: Request, workspace: str) -> Response:
        now = timezone.now()
        since = _when(request, "since", now.replace(day=1, hour=0, minute=0, second=0, microsecond=0), now)
        until = _when(request, "until", now, now)
        by = request.query_params.get("by") or "user"
        if by not in KEYS:
            raise ApplicationError(f"by: one of {', '.join(KEYS)}, not {by[:40]!r}.")
        if not since < until:
            raise ApplicationError(f"since ({since.isoformat()}) must be before until ({until.isoformat()}).")
        if until - since > timedelta(days=MAX_WINDOW_DAYS):
            raise ApplicationError(f"since..until: at most {MAX_WINDOW_DAYS} days at once.")
        report = cost_report(workspace=self.workspace, since=since, until=until, by=_key(by), now=now)
        body = {
            "currency": "USD",
            "since": since,
            "until": until,
            "by": by,
            "total": shown(report.total),
            "idle": shown(report.idle),
            "rows": [{"key": row.key, "cost": shown(row.cost)} for row in report.rows],
        }
        return Response(CostReportOut(body).data)


def _key(by: str) -> Key:
    return next(key for key in KEYS if key == by)


def _when(request: Request, name: str, default: datetime, now: datetime) -> datetime:
    raw = (request.query_params.get(name) or "").strip()
    if not raw:
        return default
    relative = _RELATIVE.match(raw)
    if relative is not None:
        amount, unit = int(relative[1]), relative[2]
        return now - (timedelta(days=amount) if unit == "d" else timedelta(hours=amount))
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise ApplicationError(
            f"{name}: {raw[:40]!r} is not a date or time (2026-11-01, 2026-11-01T09:00:00Z) nor an age (30d, 12h)."
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


# ------------------------------------------------------------------- budgets


class BudgetOut(serializers.Serializer):
    user = serializers.CharField(allow_null=True, help_text="the member's username; null: the workspace's own row")
    monthly_limit = serializers.CharField(allow_null=True, help_text="USD a month (UTC); null: no cap")
    gpu_quota = serializers.IntegerField(allow_null=True, help_text="a member's running GPUs at once; null: none")
    warn_percent = serializers.IntegerField(help_text="the workspace's subscriptions are told at this percent")
    spent = serializers.CharField(help_text="USD spent this month (UTC) by what the budget counts")
    rate_per_hour = serializers.CharField(help_text="USD per hour: what it spends now (its running machines)")
    percent = serializers.FloatField(allow_null=True, help_text="spent / monthly_limit × 100; null: no limit")
    gpus_running = serializers.IntegerField(
        allow_null=True, help_text="the GPUs its active jobs hold now (the workspace's row: all of them)"
    )


class BudgetsOut(serializers.Serializer):
    currency = serializers.CharField(help_text='always "USD"')
    month = serializers.CharField(help_text="the month counted, YYYY-MM (UTC)")
    budgets = BudgetOut(many=True, help_text="the workspace's row first, then each member with a budget, by name")


class BudgetIn(serializers.Serializer):
    monthly_limit = serializers.CharField(
        required=False, allow_null=True, help_text='USD, e.g. "500" or "499.99"; null: no monthly cap'
    )
    gpu_quota = serializers.IntegerField(required=False, allow_null=True, help_text="a member's budget only")
    warn_percent = serializers.IntegerField(required=False, help_text="1 to 99 (default 80)")


class BudgetsView(WorkspaceAPIView):
    """The workspace's budgets and what each has counted this month."""

    @extend_schema(responses=BudgetsOut)
    def get(self, request: Request, workspace: str) -> Response:
        now = timezone.now()
        rows = budgets_shown(workspace=self.workspace, now=now)
        body = {"currency": "USD", "month": month_start(now).strftime("%Y-%m"), "budgets": [_row(r) for r in rows]}
        return Response(BudgetsOut(body).data)


class BudgetView(WorkspaceAPIView):
    """Set (PUT) or remove (DELETE) the workspace's budget
    (``budgets/workspace/``) or a member's (``budgets/<username>/``): admins only."""

    write_role = Role.ADMIN

    @extend_schema(request=BudgetIn, responses=BudgetOut)
    def put(self, request: Request, workspace: str, username: str = "") -> Response:
        if not isinstance(request.data, dict):
            raise ApplicationError('expected a JSON object such as {"monthly_limit": "500"}.')
        member = self._member(username)
        budget_set(workspace=self.workspace, member=member, changes=dict(request.data), actor=self._actor())
        rows = budgets_shown(workspace=self.workspace)
        name = member.username if member is not None else None
        return Response(BudgetOut(_row(next(r for r in rows if r.user == name))).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str, username: str = "") -> Response:
        budget_remove(workspace=self.workspace, member=self._member(username), actor=self._actor())
        return Response(status=204)

    def _member(self, username: str) -> User | None:
        if not username:
            return None
        membership = Membership.objects.filter(workspace=self.workspace, user__username=username).first()
        if membership is None:
            raise NotFound(f"{username[:150]!r} is not a member of {self.workspace.slug}.")
        return membership.user

    def _actor(self) -> Actor:
        return Actor(user=signed_in_user(self.request), address=client_ip(self.request))


def _row(row: BudgetShown) -> dict[str, object]:
    return {
        "user": row.user,
        "monthly_limit": None if row.monthly_limit is None else str(row.monthly_limit),
        "gpu_quota": row.gpu_quota,
        "warn_percent": row.warn_percent,
        "spent": shown(row.spent),
        "rate_per_hour": shown(row.rate_per_hour),
        "percent": row.percent,
        "gpus_running": row.gpus_running,
    }

"""REST: the workspace's costs over a window, grouped (docs/API.md,
docs/COST.md). Members and viewers read them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.tenancy import WorkspaceAPIView
from backend.billing.selectors import KEYS, Key, cost_report, shown
from backend.core.errors import ApplicationError

MAX_WINDOW_DAYS = 400
_RELATIVE = re.compile(r"^(\d{1,3})([dh])$")


class CostRowOut(serializers.Serializer):
    key = serializers.CharField(help_text="the user, workflow, backend or UTC day (YYYY-MM-DD)")
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
    rows = CostRowOut(many=True, help_text="the costliest first (by day: in date order)")


class CostReportView(WorkspaceAPIView):
    """What the workspace spent in [since, until): attempts that started
    then, grouped by user, workflow, backend or day, and the idle line."""

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

"""The costs of a window computed row by row: every attempt and machine read
and billed by ``backend.billing.rules`` at ``now``. This is the definition the
rollup (``backend.billing.rollup``) must equal exactly; the reports read the
rollup, the tests and the benchmark compare the two."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Literal
from uuid import UUID

from backend.accounts.models import Workspace
from backend.billing.rules import Machine, attempt_bill, idle_cost
from backend.clouds.models import Instance
from backend.runs.models import Attempt

Key = Literal["user", "workflow", "backend", "day", "week", "month"]
KEYS: tuple[Key, ...] = ("user", "workflow", "backend", "day", "week", "month")
DATED: frozenset[str] = frozenset({"day", "week", "month"})
ZERO = Decimal(0)

MACHINE = ("instance__price_per_hour", "instance__running_at", "instance__terminated_at")
_FIELDS = {
    "user": "job__run__submitted_by__username",
    "workflow": "job__run__workflow",
    "backend": "instance__backend",
}


def dated_key(day: date, by: Key) -> str:
    """A UTC day's row key: the day, its week's Monday, or its month."""
    if by == "week":
        return (day - timedelta(days=day.weekday())).isoformat()
    if by == "month":
        return day.strftime("%Y-%m")
    return day.isoformat()


def report_sums(
    *, workspace: Workspace, since: datetime, until: datetime, by: Key, now: datetime
) -> tuple[dict[str, Decimal], Decimal]:
    """The cost of the workspace's attempts that started in [since, until) per
    key, and the idle line of its machines that started running then."""
    field = "started_at" if by in DATED else _FIELDS[by]
    rows = Attempt.objects.filter(
        workspace=workspace, instance__isnull=False, started_at__gte=since, started_at__lt=until
    ).values_list(field, "started_at", "finished_at", *MACHINE)
    sums: dict[str, Decimal] = defaultdict(Decimal)
    for key, started, finished, *machine in rows:
        name = dated_key(started.date(), by) if by in DATED else (key or "")
        sums[name] += attempt_bill(started, finished, Machine(*machine), now).cost
    return dict(sums), idle_line(workspace=workspace, since=since, until=until, now=now)


def idle_line(*, workspace: Workspace, since: datetime, until: datetime, now: datetime) -> Decimal:
    """What the workspace's machines that started running in [since, until)
    cost while no attempt held them (between jobs, before the first and
    after the last, the rest of the 60 s minimum)."""
    machines = Instance.objects.filter(workspace=workspace, running_at__gte=since, running_at__lt=until)
    held: dict[UUID, list[Decimal]] = defaultdict(list)
    attempts = Attempt.objects.filter(instance__in=machines).values_list(
        "instance_id", "started_at", "finished_at", *MACHINE
    )
    for instance_id, started, finished, *machine in attempts:
        held[instance_id].append(attempt_bill(started, finished, Machine(*machine), now).cost)
    total = ZERO
    for pk, price, running_at, terminated_at in machines.values_list(
        "pk", "price_per_hour", "running_at", "terminated_at"
    ):
        total += idle_cost(Machine(price, running_at, terminated_at), held[pk], now)
    return total


SpendKey = tuple[UUID, int | None]  # (workspace, None) or (workspace, user)


def spent_since(*, workspace_ids: Iterable[UUID | str], since: datetime, now: datetime) -> dict[SpendKey, Decimal]:
    """Each workspace's cost of the attempts that started in [since, now)
    and its idle line (key ``(workspace, None)``) and each submitter's
    attempts' (key ``(workspace, user)``; a run without a submitter counts
    for the workspace only)."""
    ids = list(workspace_ids)
    spent: dict[SpendKey, Decimal] = defaultdict(Decimal)
    rows = Attempt.objects.filter(
        workspace_id__in=ids, instance__isnull=False, started_at__gte=since, started_at__lt=now
    ).values_list("workspace_id", "job__run__submitted_by_id", "started_at", "finished_at", *MACHINE)
    for workspace_id, user_id, started, finished, *machine in rows:
        cost = attempt_bill(started, finished, Machine(*machine), now).cost
        spent[(workspace_id, None)] += cost
        if user_id is not None:
            spent[(workspace_id, user_id)] += cost
    for workspace in Workspace.objects.filter(pk__in=ids):
        spent[(workspace.pk, None)] += idle_line(workspace=workspace, since=since, until=now, now=now)
    return dict(spent)

"""Reads of what machines cost (docs/COST.md): per attempt, job and run (one
query over their attempt rows, their machine's price and times joined in),
the workspace's report, its idle line and the month's spend (one statement
over the rollup, ``backend.billing.rollup``, and the rows still accruing),
and the running set's rate; the rules are backend.billing.rules."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Q, Sum
from django.utils import timezone

from backend.accounts.models import User, Workspace
from backend.billing import rollup
from backend.billing.models import Budget
from backend.billing.rowwise import DATED, Key, SpendKey
from backend.billing.rowwise import KEYS as KEYS  # the report's groupings, for the API
from backend.billing.rules import MONEY, AttemptBill, Machine, attempt_bill, billed_machine
from backend.clouds.models import LIVE_STATUSES, Instance
from backend.runs.models import ACTIVE_JOB, Attempt, Job

ZERO = Decimal(0)
DEFAULT_WARN_PERCENT: int = Budget._meta.get_field("warn_percent").default

_MACHINE = ("instance__price_per_hour", "instance__running_at", "instance__terminated_at")


@dataclass(frozen=True)
class ReportRow:
    key: str
    cost: Decimal


@dataclass(frozen=True)
class CostReport:
    """The workspace's cost over [since, until): ``total`` = the rows' sum + ``idle``."""

    total: Decimal
    idle: Decimal
    rows: list[ReportRow]


def attempt_bills(attempt_ids: Iterable[UUID | str], now: datetime | None = None) -> dict[UUID, AttemptBill]:
    """Each attempt's bill (one query); an attempt that never held a machine has none."""
    now = now or timezone.now()
    rows = Attempt.objects.filter(pk__in=list(attempt_ids), instance__isnull=False).values_list(
        "pk", "started_at", "finished_at", *_MACHINE
    )
    return {pk: attempt_bill(started, finished, Machine(*machine), now) for pk, started, finished, *machine in rows}


def attempt_costs(attempts: Iterable[Attempt], now: datetime | None = None) -> dict[UUID, Decimal]:
    """Each attempt's cost: its machine's price × the seconds it held it (until now for a running one)."""
    return {pk: bill.cost for pk, bill in attempt_bills([a.pk for a in attempts], now).items()}


def attempt_bill_of(attempt: Attempt, now: datetime) -> AttemptBill | None:
    """An attempt's bill from the attempt and its instance as loaded (no
    query: the caller selected the instance with it); None when it held no machine."""
    instance = attempt.instance if attempt.instance_id is not None else None
    if instance is None:
        return None
    return attempt_bill(attempt.started_at, attempt.finished_at, billed_machine(instance), now)


def bills_total(attempts: Iterable[tuple[datetime | None, AttemptBill | None]]) -> Decimal | None:
    """The cost of (started_at, bill) pairs: the sum over the attempts that
    started on a machine; None when none did (the cost is unknown)."""
    costs = [bill.cost for started, bill in attempts if started is not None and bill is not None]
    return sum(costs, ZERO) if costs else None


def shown(amount: Decimal | None) -> str | None:
    """Money as the API shows it: a decimal string to a hundredth of a cent; None stays None."""
    return None if amount is None else str(amount.quantize(MONEY))


def run_costs(run_ids: Iterable[UUID | str], now: datetime | None = None) -> dict[UUID, Decimal]:
    """Each run's cost, the sum over every attempt of every job (interrupted
    ones included), in ONE query for a page of runs; a run none of whose
    attempts started on a machine is absent (its cost is unknown)."""
    return _sums("job__run_id", Q(job__run_id__in=list(run_ids)), now)


def job_costs(job_ids: Iterable[UUID | str], now: datetime | None = None) -> dict[UUID, Decimal]:
    """Each job's cost, the sum over its attempts (one query); absent: unknown."""
    return _sums("job_id", Q(job_id__in=list(job_ids)), now)


def cost_report(
    *, workspace: Workspace, since: datetime, until: datetime, by: Key, now: datetime | None = None
) -> CostReport:
    """The cost of the workspace's attempts that started in [since, until),
    grouped by ``by`` (the run's submitter's username, its workflow, the
    machine's backend, or the UTC day, week (its Monday) or month the
    attempt started), the costliest first (dated keys: in date order), and
    the idle line of the machines that started running then. Read from the
    rollup and the live rows in one statement: equal to the row-by-row
    computation (``rowwise.report_sums``)."""
    now = now or timezone.now()
    sums: dict[str, Decimal] = defaultdict(Decimal)
    idle = ZERO
    names: dict[int, str] = {}
    rows = _window([workspace.pk], since, until, by, now)
    if by == "user":
        ids = {key for kind, _, key, _, _ in rows if kind == "a" and key}
        names = dict(User.objects.filter(pk__in=ids).values_list("pk", "username"))
    for kind, _, key, cost, items in rows:
        if kind == "i":
            idle += cost
        elif items:
            sums[names.get(key, "") if by == "user" else key] += cost
    ordered = sorted(sums.items(), key=lambda kv: (kv[0],) if by in DATED else (-kv[1], kv[0]))
    report_rows = [ReportRow(key=key, cost=cost) for key, cost in ordered]
    return CostReport(total=sum((r.cost for r in report_rows), ZERO) + idle, idle=idle, rows=report_rows)


def idle_line(*, workspace: Workspace, since: datetime, until: datetime, now: datetime | None = None) -> Decimal:
    """What the workspace's machines that started running in [since, until)
    cost while no attempt held them (between jobs, before the first and
    after the last, the rest of the 60 s minimum)."""
    return cost_report(workspace=workspace, since=since, until=until, by="backend", now=now).idle


def _window(
    workspace_ids: list[UUID], since: datetime, until: datetime, by: Key, now: datetime
) -> list[tuple[str, UUID, Any, Decimal, int]]:
    """(kind, workspace, key, cost, items) of [since, until), keyed by ``by``
    ("user": the submitter's id, 0 for none): ``rollup.WINDOW``."""
    if not since < until or not workspace_ids:
        return []
    params: dict[str, Any] = {
        "ws": workspace_ids,
        "since": since,
        "until": until,
        "now": now,
        "first_day": since.astimezone(UTC).date(),
        "last_day": (until - timedelta(microseconds=1)).astimezone(UTC).date(),
    }
    with connection.cursor() as cursor:
        cursor.execute(rollup.WINDOW.format(key=rollup.GROUPINGS[by]), params)
        return list(cursor.fetchall())


def dangerously_all_workspaces_running_cost_per_hour() -> dict[str, Decimal]:
    """Each workspace's live machines' price per hour, summed, by slug (for
    the operator's /metrics): what the running set costs an hour now."""
    rows = Instance.objects.filter(status__in=LIVE_STATUSES, running_at__isnull=False).values_list(
        "workspace__slug", "price_per_hour"
    )
    rates: dict[str, Decimal] = defaultdict(Decimal)
    for slug, price in rows:
        rates[slug] += price
    return dict(rates)


def _sums(field: str, where: Q, now: datetime | None) -> dict[UUID, Decimal]:
    now = now or timezone.now()
    rows = Attempt.objects.filter(where, instance__isnull=False, started_at__isnull=False).values_list(
        field, "started_at", "finished_at", *_MACHINE
    )
    sums: dict[UUID, Decimal] = defaultdict(Decimal)
    for key, started, finished, *machine in rows:
        sums[key] += attempt_bill(started, finished, Machine(*machine), now).cost
    return dict(sums)


@dataclass(frozen=True)
class Spend:
    """What a budget's scope spent since the month's start (UTC) and what its
    running machines cost an hour now (``rate``): the budgets' measure."""

    spent: Decimal
    rate: Decimal


def month_start(now: datetime) -> datetime:
    """The first instant of ``now``'s calendar month, UTC: where a monthly budget starts."""
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def month_spend(*, workspace_ids: Iterable[UUID | str], now: datetime | None = None) -> dict[SpendKey, Spend]:
    """Each workspace's spend this month (key ``(workspace, None)``: every
    attempt that started this month and the idle line) and each submitter's
    (key ``(workspace, user)``: the attempts of the runs they submitted).
    ``rate``: the workspace's running machines' prices (idle ones too), a
    member's: the machines their running attempts hold."""
    now = now or timezone.now()
    ids = [UUID(str(pk)) for pk in workspace_ids]
    spent: dict[SpendKey, Decimal] = defaultdict(Decimal)
    rate: dict[SpendKey, Decimal] = defaultdict(Decimal)
    for workspace_id in Workspace.objects.filter(pk__in=ids).values_list("pk", flat=True):
        spent[(workspace_id, None)] += ZERO
    for kind, workspace_id, user_id, cost, items in _window(ids, month_start(now), now, "user", now):
        spent[(workspace_id, None)] += cost
        if kind == "a" and user_id and items:
            spent[(workspace_id, user_id)] += cost
    live = Instance.objects.filter(workspace_id__in=ids, status__in=LIVE_STATUSES, running_at__isnull=False)
    for workspace_id, price in live.values_list("workspace_id", "price_per_hour"):
        rate[(workspace_id, None)] += price
    running = Attempt.objects.filter(
        workspace_id__in=ids, instance__in=live, started_at__isnull=False, finished_at__isnull=True
    ).values_list("workspace_id", "job__run__submitted_by_id", "instance__price_per_hour")
    for workspace_id, user_id, price in running:
        rate[(workspace_id, user_id)] += price
    return {key: Spend(spent=spent[key], rate=rate[key]) for key in {*spent, *rate}}


@dataclass(frozen=True)
class BudgetShown:
    """A budget as the budgets' page shows it, with this month's measure.
    ``user``: the member's username; None: the workspace's own row."""

    user: str | None
    monthly_limit: Decimal | None
    gpu_quota: int | None
    warn_percent: int
    spent: Decimal
    rate_per_hour: Decimal
    percent: float | None  # spent / monthly_limit, to a tenth; None: no limit
    gpus_running: int


def budgets_shown(*, workspace: Workspace, now: datetime | None = None) -> list[BudgetShown]:
    """The workspace's row first (always there: its spend, its budget if it
    has one), then each member who has a budget, by username."""
    now = now or timezone.now()
    budgets = {b.user_id: b for b in Budget.objects.filter(workspace=workspace).select_related("user")}
    spend = month_spend(workspace_ids=[workspace.pk], now=now)
    gpus = gpus_running(workspace_id=workspace.pk)
    members = sorted(
        (b for b in budgets.values() if b.user is not None), key=lambda b: b.user.username if b.user else ""
    )
    rows = []
    for user_id, budget in [(None, budgets.get(None)), *[(b.user_id, b) for b in members]]:
        measure = spend.get((workspace.pk, user_id), Spend(ZERO, ZERO))
        limit = budget.monthly_limit if budget is not None else None
        rows.append(
            BudgetShown(
                user=budget.user.username if budget is not None and budget.user is not None else None,
                monthly_limit=limit,
                gpu_quota=budget.gpu_quota if budget is not None else None,
                warn_percent=budget.warn_percent if budget is not None else DEFAULT_WARN_PERCENT,
                spent=measure.spent,
                rate_per_hour=measure.rate,
                percent=round(float(measure.spent / limit * 100), 1) if limit else None,
                gpus_running=gpus.get(user_id, 0),
            )
        )
    return rows


def budgets_with_limit(*, workspace_id: UUID | str, user_id: int) -> list[Budget]:
    """The budgets with a monthly limit that apply to a run ``user_id``
    submits: the workspace's own and the submitter's (the workspace's first)."""
    budgets = Budget.objects.filter(workspace_id=workspace_id, monthly_limit__isnull=False).filter(
        Q(user__isnull=True) | Q(user_id=user_id)
    )
    return sorted(budgets, key=lambda b: b.user_id is not None)


def gpus_running(*, workspace_id: UUID | str) -> dict[int | None, int]:
    """The GPUs the workspace's active jobs (assigned, running, stopping)
    hold: key None the workspace's total, else each submitter's."""
    rows = (
        Job.objects.filter(workspace_id=workspace_id, status__in=ACTIVE_JOB, gpu_count__gt=0)
        .values_list("run__submitted_by_id")
        .annotate(gpus=Sum("gpu_count"))
    )
    out: dict[int | None, int] = {None: 0}
    for user_id, gpus in rows:
        out[user_id] = out.get(user_id, 0) + int(gpus)
        out[None] += int(gpus)
    return out

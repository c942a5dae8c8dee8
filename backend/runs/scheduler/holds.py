"""What keeps a pending job from starting although a machine could take it:
a budget that applies to it, or its submitter's GPU quota (docs/COST.md,
"Budgets and quotas").

A budget applies to a job if it is its workspace's, its run's submitter's
(both skipped for a run an admin let past them, ``Run.budget_override``),
or its run's ``max_cost``. Each is checked as a monthly limit: the job waits
while the budget's spend has reached it, or while that spend plus the job's
``estimate_max_cost`` would pass it. A member's ``gpu_quota``: the job
waits while the GPUs their jobs hold plus its own would pass the quota.

``Holds.read`` reads what a scheduling pass needs in a few queries for all
its pending jobs at once (nothing per job; the month's spend at most once
per check interval, ``spend_recent``); a pass tells it each job it assigns
(``took``), so two jobs of one pass cannot both fill the last GPUs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol
from uuid import UUID

from django.conf import settings
from django.db.models import Exists, OuterRef, Sum
from django.utils import timezone

from backend.accounts.models import User
from backend.billing.models import Budget
from backend.billing.selectors import SpendKey, month_spend, run_costs
from backend.runs.models import ACTIVE_JOB, Attempt, Job

ZERO = Decimal(0)
BILLING_MINUTE = 60  # seconds: the least a machine is billed (EC2's minimum)


def money(amount: Decimal) -> str:
    """Dollars as a budget's message shows them: $1,234.50."""
    return f"${amount:,.2f}"


# The month's spend of each workspace as last read in this process:
# {workspace: (when, {(workspace, user|None): (spent, rate)})}.
_SPEND: dict[UUID, tuple[float, dict[SpendKey, tuple[Decimal, Decimal]]]] = {}


def spend_record(spends: dict[SpendKey, tuple[Decimal, Decimal]], workspaces: Iterable[UUID]) -> None:
    """Remember what ``month_spend`` just said for ``workspaces`` (the budgets' check records every read)."""
    at = time.monotonic()
    for ws in workspaces:
        _SPEND[ws] = (at, {key: value for key, value in spends.items() if key[0] == ws})


def spend_recent(workspaces: set[UUID], now: datetime) -> dict[SpendKey, tuple[Decimal, Decimal]]:
    """The month's spend of ``workspaces``, read at most once per
    ``TRAINYARD_BUDGET_CHECK_SECONDS`` in this process: a scheduling pass
    holds jobs by a spend at most one check old (the check itself reads it
    afresh every time), and does not pay for reading a month of attempts."""
    fresh = float(settings.TRAINYARD["BUDGET_CHECK_SECONDS"])
    at = time.monotonic()
    stale = {ws for ws in workspaces if ws not in _SPEND or at - _SPEND[ws][0] > fresh}
    if stale:
        spends = month_spend(workspace_ids=stale, now=now)
        spend_record({key: (v.spent, v.rate) for key, v in spends.items()}, stale)
    out: dict[SpendKey, tuple[Decimal, Decimal]] = {}
    for ws in workspaces:
        out.update(_SPEND[ws][1])
    return out


class Budgeted(Protocol):
    """What deciding a run's budgets reads of it (a ``Run``, or a ``RunFacts``)."""

    @property
    def pk(self) -> Any: ...
    @property
    def workspace_id(self) -> Any: ...
    @property
    def submitted_by_id(self) -> int | None: ...
    @property
    def max_cost(self) -> Decimal | None: ...
    @property
    def budget_override(self) -> bool: ...


@dataclass(frozen=True)
class RunFacts:
    """A run's budget facts read as plain values (many runs at once, no model instances)."""

    pk: UUID
    workspace_id: UUID
    submitted_by_id: int | None
    max_cost: Decimal | None
    budget_override: bool
    name: str


@dataclass(frozen=True)
class Limit:
    """One budget that applies to a run, with what its scope spent."""

    what: str  # "workspace budget", "alice's budget", "the run's max_cost"
    limit: Decimal
    spent: Decimal
    rate: Decimal  # what its running machines cost an hour now
    scope: str  # "this month", "so far"
    key: tuple[str, UUID | int | None]  # ("workspace", None), ("user", id), ("run", id)

    def reached_by(self, spent: Decimal) -> bool:
        return spent >= self.limit

    def words(self) -> str:
        """``workspace budget $500.00 reached ($500.31 spent this month)``"""
        return f"{self.what} {money(self.limit)} reached ({money(self.spent)} spent {self.scope})"


@dataclass
class Holds:
    """The budgets of the pending jobs' workspaces, what their scopes spent,
    and the GPUs each member's jobs hold: read once, asked per job."""

    budgets: dict[SpendKey, Budget] = field(default_factory=dict)
    spend: dict[SpendKey, tuple[Decimal, Decimal]] = field(default_factory=dict)
    run_spent: dict[UUID, Decimal] = field(default_factory=dict)
    run_rate: dict[UUID, Decimal] = field(default_factory=dict)  # what a run's running machines cost an hour
    gpus: dict[SpendKey, int] = field(default_factory=lambda: defaultdict(int))
    names: dict[int, str] = field(default_factory=dict)
    last_price: dict[UUID, Decimal] = field(default_factory=dict)  # a job's last attempt's machine, per hour

    @classmethod
    def read(cls, job_ids: Collection[UUID | str], now: datetime | None = None) -> Holds:
        """What deciding these jobs needs: their workspaces' budgets, and,
        only where a budget or a ``max_cost`` exists, the month's spend, the
        runs' costs and the members' GPUs in use."""
        now = now or timezone.now()
        budgeted = Exists(Budget.objects.filter(workspace_id=OuterRef("workspace_id")))
        found = Job.objects.filter(pk__in=list(job_ids)).annotate(budgeted=budgeted)
        rows = list(found.values_list("workspace_id", "run_id", "run__max_cost", "budgeted"))
        holds = cls()
        workspaces = {ws for ws, _, _, has in rows if has}
        if workspaces:  # most workspaces have no budget: one query then
            for budget in Budget.objects.filter(workspace_id__in=workspaces):
                holds.budgets[(budget.workspace_id, budget.user_id)] = budget
        limited = {ws for (ws, _), b in holds.budgets.items() if b.monthly_limit is not None}
        if limited:
            holds.spend = spend_recent(limited, now)
        if limited or any(cap is not None for _, _, cap, _ in rows):
            # Each job's latest attempt that had a machine (DISTINCT ON the job, its highest number).
            last = (
                Attempt.objects.filter(job_id__in=list(job_ids), instance__isnull=False)
                .order_by("job_id", "-number")
                .distinct("job_id")
                .values_list("job_id", "instance__price_per_hour")
            )
            holds.last_price = {job: price for job, price in last if price is not None}
        capped = [run for _, run, cap, _ in rows if cap is not None]
        if capped:
            holds.run_spent = run_costs(capped, now=now)
        quota = {ws for (ws, user), b in holds.budgets.items() if user is not None and b.gpu_quota is not None}
        if quota:
            held = (
                Job.objects.filter(workspace_id__in=quota, status__in=ACTIVE_JOB, gpu_count__gt=0)
                .values_list("workspace_id", "run__submitted_by_id")
                .annotate(gpus=Sum("gpu_count"))
            )
            for ws, user, gpus in held:
                holds.gpus[(ws, user)] += gpus
        members = {user for (_, user) in holds.budgets if user is not None}
        if members:
            holds.names = dict(User.objects.filter(pk__in=members).values_list("pk", "username"))
        return holds

    def limits(self, run: Budgeted) -> list[Limit]:
        """The budgets with a limit that apply to the run's jobs, with their spend."""
        found: list[Limit] = []
        if not run.budget_override:
            for user in (None, run.submitted_by_id):
                budget = self.budgets.get((run.workspace_id, user))
                if budget is None or budget.monthly_limit is None:
                    continue
                spent, rate = self.spend.get((run.workspace_id, user), (ZERO, ZERO))
                what = "workspace budget" if user is None else f"{self.names.get(user, 'the submitter')}'s budget"
                key: tuple[str, UUID | int | None] = ("workspace", None) if user is None else ("user", user)
                found.append(Limit(what, budget.monthly_limit, spent, rate, "this month", key))
        if run.max_cost is not None:
            spent = self.run_spent.get(run.pk, ZERO)
            rate = self.run_rate.get(run.pk, ZERO)
            found.append(Limit("the run's max_cost", run.max_cost, spent, rate, "so far", ("run", run.pk)))
        return found

    def hold(self, job: Job) -> str | None:
        """Why ``job`` (its run selected) waits now, None if nothing holds it."""
        return self.budget_hold(job) or self._gpu_hold(job)

    def budget_hold(self, job: Job) -> str | None:
        """Why a budget keeps ``job`` waiting: one that applies is reached, or
        what the job would add passes it: its ``estimate_max_cost``, else, for
        a job that ran before (one the budget stopped), the one billing minute
        a machine like its last one costs at the least (so that a stop is not
        followed by a start that the next check stops again)."""
        need, why = job.estimate_max_cost, "this job may cost up to"
        if need is None and job.pk in self.last_price:
            need, why = self.last_price[job.pk] * BILLING_MINUTE / 3600, "a billing minute of its last machine costs"
        for limit in self.limits(job.run):
            if limit.reached_by(limit.spent):
                return f"waiting for budget: {limit.words()}"
            if need is not None and limit.spent + need > limit.limit:
                return (
                    f"waiting for budget: {limit.what} {money(limit.limit)}, {money(limit.spent)} spent "
                    f"{limit.scope}, {why} {money(need)}"
                )
        return None

    def _gpu_hold(self, job: Job) -> str | None:
        user = job.run.submitted_by_id
        budget = self.budgets.get((job.workspace_id, user)) if user is not None else None
        if budget is None or budget.gpu_quota is None or job.gpu_count == 0:
            return None
        held = self.gpus[(job.workspace_id, user)]
        if held + job.gpu_count <= budget.gpu_quota:
            return None
        name = self.names.get(user, "the submitter") if user is not None else "the submitter"
        in_use = f"{held} GPU{'s' if held != 1 else ''} {'are' if held != 1 else 'is'} in use"
        return f"waiting for GPU quota: {name}'s {in_use} (quota {budget.gpu_quota}, this job needs {job.gpu_count})"

    def took(self, job: Job) -> None:
        """``job`` was given a machine in this pass: its GPUs are in use now."""
        if job.gpu_count and job.run.submitted_by_id is not None:
            self.gpus[(job.workspace_id, job.run.submitted_by_id)] += job.gpu_count

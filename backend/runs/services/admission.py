"""Estimates and admission at submission (docs/COST.md, "Estimates" and
"Budgets and quotas").

Estimates: a job's ``max_cost`` is its cheapest offer's price × its
``max_duration`` (at least one billing minute); None when it has no
``max_duration`` (unbounded) or no offer (price unknown). A run's
``estimate`` is its jobs' sum, None if any job's is None.

Admission, in the submission's transaction before anything is written
(``budgets_admit``): each budget that applies with a ``monthly_limit`` (the
workspace's and the submitter's, both skipped with an admin's
``budget_override``) refuses the run when ``spent + estimate > limit``, or,
for an unbounded run, when ``spent + one billing minute of its jobs'
cheapest offers >= limit``. A run that costs nothing (free offers) is never
refused. With ``queue`` the run is written and its jobs wait with the reason
instead (the scheduler's hold starts them when there is room).

The run's own ``max_cost`` (``max_cost_check``, before the transaction):
refused below one billing minute of any job's cheapest offer, or below the
run's estimate (the run could never be let start by its own cap, so
``queue`` does not help).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from http import HTTPStatus
from typing import Any

from backend.accounts.guards import duration_words
from backend.accounts.models import Membership, Role, User, Workspace
from backend.billing.models import Budget
from backend.billing.rules import MINIMUM_SECONDS, cost_of
from backend.billing.selectors import ZERO, Spend, budgets_with_limit, month_spend, shown
from backend.core.errors import ApplicationError
from backend.runs.lifecycle.placement import Placement

# A refusal: the request is fine, the budget has no room for it now.
REFUSED = HTTPStatus.CONFLICT
WAITING = "waiting for budget: "


@dataclass(frozen=True)
class JobEstimate:
    job: str
    price_per_hour: Decimal | None  # the cheapest offer's; None: no offer
    max_duration: int | None  # seconds; None: unbounded
    max_cost: Decimal | None  # None: unbounded or no offer

    @property
    def minute(self) -> Decimal:
        """One billing minute of its cheapest offer (0 without one)."""
        return cost_of(self.price_per_hour, MINIMUM_SECONDS) if self.price_per_hour is not None else ZERO


@dataclass(frozen=True)
class Estimate:
    jobs: tuple[JobEstimate, ...]

    @property
    def total(self) -> Decimal | None:
        """The most the run may cost; None when any job is unbounded or unpriced."""
        costs = [job.max_cost for job in self.jobs]
        return None if any(c is None for c in costs) else sum((c for c in costs if c is not None), ZERO)

    @property
    def minute(self) -> Decimal:
        """One billing minute of every job's cheapest offer."""
        return sum((job.minute for job in self.jobs), ZERO)

    def words(self) -> str:
        """``2 jobs × max_duration 4h``, or ``2 jobs up to their max_duration``."""
        count = f"{len(self.jobs)} job{'s' * (len(self.jobs) != 1)}"
        durations = {job.max_duration for job in self.jobs}
        only = next(iter(durations)) if len(durations) == 1 else None
        if only is not None:
            return f"{count} × max_duration {duration_words(only)}"
        return f"{count} up to their max_duration"


def job_estimate(*, job: str, offer: Mapping[str, Any], placement: Mapping[str, Any]) -> JobEstimate:
    """A job's estimate from its cheapest offer (``offerplan.offer_plan``: its
    compute and its root volume, as the machine is billed) and its placement."""
    storage = Decimal(str(offer.get("storage_price_per_hour") or 0))
    price = Decimal(str(offer["price_per_hour"])) + storage if offer.get("offers") else None
    seconds = Placement.from_spec(placement).max_duration
    cost = cost_of(price, max(MINIMUM_SECONDS, seconds)) if price is not None and seconds is not None else None
    return JobEstimate(job=job, price_per_hour=price, max_duration=seconds, max_cost=cost)


def max_cost_check(*, max_cost: Decimal, estimate: Estimate) -> None:
    """Refuse a run whose own ``max_cost`` could never let it run (module rules)."""
    for job in estimate.jobs:
        if job.price_per_hour is not None and job.minute > max_cost:
            raise ApplicationError(
                f"max_cost ${max_cost:.2f} is below one billing minute of job {job.job}'s cheapest offer "
                f"(${job.minute:.4f}: 60 s at ${job.price_per_hour:.4f}/h): no attempt could run. "
                "Raise max_cost (workflow key max_cost, trainyard run --max-cost).",
                extra={"max_cost": str(max_cost), "minute": shown(job.minute)},
            )
    total = estimate.total
    if total is not None and total > max_cost:
        raise ApplicationError(
            f"max_cost ${max_cost:.2f} is below what this run may cost: up to ${total:.2f} "
            f"({estimate.words()}). Raise max_cost or lower max_duration.",
            extra={"max_cost": str(max_cost), "estimate": shown(total)},
            status_code=REFUSED,
        )
    if total is None and estimate.minute > max_cost:
        raise ApplicationError(
            f"max_cost ${max_cost:.2f} is below one billing minute of this run's jobs (${estimate.minute:.4f}). "
            "Raise max_cost.",
            extra={"max_cost": str(max_cost), "minute": shown(estimate.minute)},
        )


def override_check(*, workspace: Workspace, user: User) -> None:
    """Only the workspace's admins let a run past the budgets."""
    role = Membership.objects.filter(workspace=workspace, user=user).values_list("role", flat=True).first()
    if role != Role.ADMIN:
        raise ApplicationError(
            f"Your role in {workspace.slug} is {role or 'none'}: only admins can let a run past the budgets "
            "(budget_override, --override-budget).",
            status_code=HTTPStatus.FORBIDDEN,
        )


def budgets_admit(*, workspace: Workspace, user: User, estimate: Estimate, override: bool, queue: bool) -> str | None:
    """None when every budget that applies has room for the run; with
    ``queue``, the jobs' waiting reason when one has not; else
    ApplicationError (409) naming the budget and the numbers."""
    if override or (estimate.total == ZERO) or (estimate.total is None and estimate.minute == ZERO):
        return None
    budgets = budgets_with_limit(workspace_id=workspace.pk, user_id=user.pk)
    if not budgets:
        return None
    spend = month_spend(workspace_ids=[workspace.pk])
    for budget in budgets:
        measure = spend.get((workspace.pk, budget.user_id), Spend(ZERO, ZERO))
        words = _refusal(budget, user, measure.spent, estimate)
        if words is None:
            continue
        if queue:
            return f"{WAITING}{words}"
        raise ApplicationError(
            f"{words}; {_advice(budget, user, measure.spent, estimate)}",
            extra={
                "budget": {
                    "user": user.username if budget.user_id is not None else None,
                    "monthly_limit": str(budget.monthly_limit),
                    "spent": shown(measure.spent),
                    "estimate": shown(estimate.total),
                    "minute": shown(estimate.minute),
                }
            },
            status_code=REFUSED,
        )
    return None


def _refusal(budget: Budget, user: User, spent: Decimal, estimate: Estimate) -> str | None:
    limit = budget.monthly_limit
    assert limit is not None
    name = "workspace budget" if budget.user_id is None else f"{user.username}'s budget"
    head = f"{name}: ${limit:,.2f} this month, ${spent:,.2f} spent"
    total = estimate.total
    if total is not None:
        return f"{head}, this run may cost up to ${total:,.2f} ({estimate.words()})" if spent + total > limit else None
    if spent + estimate.minute >= limit:
        return (
            f"{head}, this run has no max_duration and one billing minute of its cheapest offers "
            f"costs ${estimate.minute:,.4f}"
        )
    return None


def _advice(budget: Budget, user: User, spent: Decimal, estimate: Estimate) -> str:
    needed = math.ceil(spent + (estimate.total if estimate.total is not None else estimate.minute))
    member = f" --user {user.username}" if budget.user_id is not None else ""
    shorter = "lower max_duration" if estimate.total is not None else "set max_duration"
    return f"raise it (trainyard budget set {needed}{member}), {shorter}, or submit with --queue"


def estimate_shown(jobs: Sequence[JobEstimate]) -> dict[str, Any]:
    """``{"estimate": …, "jobs": {name: max_cost}}`` as the API shows them (decimal strings or null)."""
    estimate = Estimate(tuple(jobs))
    return {"estimate": shown(estimate.total), "jobs": {job.job: shown(job.max_cost) for job in jobs}}

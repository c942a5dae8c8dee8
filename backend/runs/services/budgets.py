"""Budgets acted on (docs/COST.md, "What happens at each threshold").

``budgets_enforce`` runs from Celery beat every
``TRAINYARD_BUDGET_CHECK_SECONDS``. For every budget with a limit over a
running job (the workspace's, the submitter's, the run's ``max_cost``;
``scheduler.holds`` says which apply) it reads what the scope spent and
what its running machines cost an hour, and:

- at ``warn_percent`` and at 100 % of the limit: a ``BudgetAlert`` and the
  notice ``budget.80`` / ``budget.100``, each once a month per budget;
- once ``spent + rate × the check interval`` reaches the limit (the next
  check would come too late): each run a reached budget applies to is
  stopped, its running jobs by ``job_stop_by_server`` with
  ``budget_exceeded``, as at a spot notice: the runner stops the commands
  and syncs the job's checkpoint before it reports, the machine is retired
  at once instead of idling for reuse. A reached workspace budget also
  retires the workspace's idle machines. Stopping before the limit rather
  than after it keeps the overshoot within what the stop itself takes
  (at most one billing minute of the running set).

A run stopped so resumes on the same jobs, each from its latest checkpoint
(``transitions.run_resume_budget_stopped``): when a budget that stopped it is
raised or removed (``budget_raised``, on backend.billing's
``budget_raised`` signal: ``on_budget_raised``), or by ``trainyard rerun``
(``run_resume_if_budget_stopped``). Whether its jobs start then is the
scheduler's budget hold's to say.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from backend.accounts.models import User
from backend.billing.models import Budget, BudgetAlert
from backend.billing.selectors import month_spend, month_start, run_costs
from backend.clouds.models import LIVE_STATUSES, BackendKind, Instance, InstanceReason, InstanceStatus
from backend.clouds.services.instances import instance_request_termination
from backend.notify.services import notify_event
from backend.runs.lifecycle.transitions import job_stop_by_server, run_resume_budget_stopped
from backend.runs.models import LIVE_ATTEMPT, Attempt, Job, JobStatus, Run, RunStatus
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.holds import Holds, Limit, RunFacts, money, spend_record

logger = logging.getLogger(__name__)

ZERO = Decimal(0)
HUNDRED = Decimal(100)
RUNNING = (JobStatus.ASSIGNED, JobStatus.RUNNING)


@dataclass(frozen=True)
class Enforced:
    """What one check did: runs stopped, alerts sent, idle machines retired."""

    stopped: list[str]
    alerts: list[str]
    retired: int


def budgets_enforce(now: datetime | None = None) -> Enforced:
    """One check of every budget with a limit over the running jobs (and of
    each workspace budget whose workspace has a live machine)."""
    now = now or timezone.now()
    ahead = timedelta(seconds=float(settings.TRAINYARD["BUDGET_CHECK_SECONDS"]))
    limited = set(Budget.objects.filter(monthly_limit__isnull=False).values_list("workspace_id", flat=True))
    running = (
        Job.objects.filter(status__in=RUNNING, stop_reason="")
        .filter(Q(workspace_id__in=limited) | Q(run__max_cost__isnull=False))
        .values_list("run_id", "workspace_id", "run__submitted_by_id", "run__max_cost", "run__budget_override")
        .distinct()
    )
    runs = {row[0]: RunFacts(*row, name="") for row in running}
    live = set(
        Instance.objects.filter(workspace_id__in=limited, status__in=LIVE_STATUSES)
        .values_list("workspace_id", flat=True)
        .distinct()
    )
    workspaces = {run.workspace_id for run in runs.values()} | live
    if not workspaces:
        return Enforced([], [], 0)
    holds = _holds(workspaces, workspaces & limited, runs.values(), now)
    # The month's budgets reached, each read once; a run is looked at only
    # if one of its own is among them or it has a max_cost of its own.
    full = {
        key
        for key, budget in holds.budgets.items()
        if budget.monthly_limit is not None
        and _reached(budget.monthly_limit, *holds.spend.get(key, (ZERO, ZERO)), ahead)
    }
    reached: dict[UUID, Limit] = {}
    for run in runs.values():
        if run.max_cost is None and (
            run.budget_override or not {(run.workspace_id, None), (run.workspace_id, run.submitted_by_id)} & full
        ):
            continue
        for limit in holds.limits(run):
            if _reached(limit.limit, limit.spent, limit.rate, ahead):
                reached.setdefault(run.pk, limit)
                break
    alerts = _alerts(holds, now, ahead)
    stopped = [name for run_id, limit in reached.items() if (name := _stop_run(run_id, limit))]
    retired = 0
    for ws in workspaces:
        budget = holds.budgets.get((ws, None))
        spent, rate = holds.spend.get((ws, None), (ZERO, ZERO))
        cap = budget.monthly_limit if budget is not None else None
        if cap is not None and _reached(cap, spent, rate, ahead):
            retired += _retire_idle(ws, cap, spent)
    return Enforced(stopped, alerts, retired)


def _reached(limit: Decimal, spent: Decimal, rate: Decimal, ahead: timedelta) -> bool:
    """The limit is reached, or will be before the next check (``ahead``) at ``rate`` an hour."""
    return spent + rate * Decimal(ahead.total_seconds()) / 3600 >= limit


def _holds(workspaces: set[UUID], limited: set[UUID], runs: Iterable[RunFacts], now: datetime) -> Holds:
    """The budgets of ``workspaces``, the month's spend of those with a
    limit (``limited``), and the capped running runs' costs and rates."""
    holds = Holds()
    for budget in Budget.objects.filter(workspace_id__in=workspaces):
        holds.budgets[(budget.workspace_id, budget.user_id)] = budget
    if limited:
        spends = month_spend(workspace_ids=limited, now=now)
        holds.spend = {key: (s.spent, s.rate) for key, s in spends.items()}
        spend_record(holds.spend, limited)
    capped = {run.pk for run in runs if run.max_cost is not None}
    if capped:
        holds.run_spent = run_costs(capped, now=now)
        held = (
            Attempt.objects.filter(job__run_id__in=capped, status__in=LIVE_ATTEMPT, started_at__isnull=False)
            .filter(instance__running_at__isnull=False)
            .values_list("job__run_id", "instance__price_per_hour")
        )
        for run_id, price in held:
            holds.run_rate[run_id] = holds.run_rate.get(run_id, ZERO) + price
    members = {user for (_, user) in holds.budgets if user is not None}
    if members:
        holds.names = dict(User.objects.filter(pk__in=members).values_list("pk", "username"))
    return holds


def _stop_run(run_id: UUID, limit: Limit) -> str | None:
    """Stop the run's live jobs for ``limit`` (running ones checkpoint-safe,
    pending ones at once); its name if a job was stopped."""
    message = f"stopped by the budget: {limit.words()}"
    stopped = 0
    jobs = Job.objects.filter(run_id=run_id, status__in=[*RUNNING, JobStatus.PENDING], stop_reason="")
    for job in jobs.order_by("pk"):
        if job_stop_by_server(job=job, reason=TerminationReason.BUDGET_EXCEEDED, message=message):
            stopped += 1
    if not stopped:
        return None
    name = Run.objects.filter(pk=run_id).values_list("name", flat=True).get()
    logger.info("run %s: %s", name, message)
    return name


def _retire_idle(workspace_id: UUID, limit: Decimal, spent: Decimal) -> int:
    """The workspace budget is reached: its idle cloud machines are not kept for reuse."""
    idle = Instance.objects.filter(workspace_id=workspace_id, status=InstanceStatus.IDLE).exclude(
        backend=BackendKind.SELF_HOSTED
    )
    message = f"retired: the workspace budget {money(limit)} is reached ({money(spent)} spent this month)"
    return sum(
        instance_request_termination(
            instance_id=str(pk), reason=InstanceReason.IDLE_RETIRED, message=message, only_if_idle=True
        )
        for pk in idle.values_list("pk", flat=True)
    )


def _alerts(holds: Holds, now: datetime, ahead: timedelta) -> list[str]:
    """``budget.80`` (at ``warn_percent``) / ``budget.100`` (reached as the
    stop reads it) for each workspace or member budget that crossed it this
    month and was not told yet."""
    period = month_start(now).date()
    sent: list[str] = []
    for (ws, user), budget in holds.budgets.items():
        if budget.monthly_limit is None or budget.monthly_limit <= 0:
            continue
        spent, rate = holds.spend.get((ws, user), (ZERO, ZERO))
        percent = spent * HUNDRED / budget.monthly_limit
        full = _reached(budget.monthly_limit, spent, rate, ahead)
        for level in (budget.warn_percent, 100):
            if (level == 100 and not full) or (level < 100 and percent < level and not full):
                continue
            try:
                with transaction.atomic():
                    BudgetAlert.objects.create(workspace_id=ws, budget=budget, period=period, level=level)
                    name = None if user is None else holds.names.get(user)
                    notify_event(
                        workspace_id=ws,
                        type="budget.100" if level == 100 else "budget.80",
                        data={
                            "budget": {
                                "user": name,
                                "monthly_limit": str(budget.monthly_limit),
                                "warn_percent": budget.warn_percent,
                            },
                            "month": period.strftime("%Y-%m"),
                            "spent": str(spent.quantize(Decimal("0.0001"))),
                            "rate_per_hour": str(rate.quantize(Decimal("0.0001"))),
                            "percent": float(round(percent, 1)),
                            "level": level,
                        },
                    )
            except IntegrityError:
                continue  # told already this month
            sent.append(f"{name or 'the workspace'}'s budget {level}%")
    return sent


def budget_raised(workspace_id: UUID | str, user_id: int | None) -> list[str]:
    """A budget of the workspace (``user_id`` None: its own, else that
    member's) was raised or removed: the runs it stopped whose budgets now
    leave room resume from their checkpoints. The names of the runs resumed."""
    runs = Run.objects.filter(
        workspace_id=workspace_id,
        status__in=[RunStatus.STOPPED, RunStatus.RUNNING, RunStatus.STOPPING],
        jobs__status=JobStatus.STOPPED,
        jobs__stop_reason=TerminationReason.BUDGET_EXCEEDED,
    ).distinct()
    if user_id is not None:
        runs = runs.filter(submitted_by_id=user_id)
    candidates = list(runs.order_by("created_at"))
    if not candidates:
        return []
    stopped = list(
        Job.objects.filter(
            run__in=candidates, status=JobStatus.STOPPED, stop_reason=TerminationReason.BUDGET_EXCEEDED
        ).select_related("run")
    )
    holds = Holds.read([job.pk for job in stopped])
    held = {job.run_id for job in stopped if holds.budget_hold(job)}
    resumed: list[str] = []
    for run in candidates:
        if run.pk in held:
            continue  # still no room: raising it more (or a rerun, which then waits) resumes it
        if run_resume_budget_stopped(run_id=run.pk):
            resumed.append(run.name)
    return resumed


def on_budget_raised(sender: object, *, workspace_id: UUID | str, user_id: int | None, **_: object) -> None:
    """billing's ``budget_raised`` signal (sent once the change committed): ``budget_raised``."""
    resumed = budget_raised(workspace_id, user_id)
    if resumed:
        logger.info("a raised budget of workspace %s resumed %s", workspace_id, ", ".join(resumed))


def run_stopped_by_budget(run: Run) -> bool:
    """The run ended stopped because a budget stopped its jobs."""
    return (
        run.status == RunStatus.STOPPED
        and Job.objects.filter(
            run=run, status=JobStatus.STOPPED, stop_reason=TerminationReason.BUDGET_EXCEEDED
        ).exists()
    )


def run_resume_if_budget_stopped(run: Run) -> list[str]:
    """``trainyard rerun`` of a run the budget stopped: its stopped jobs
    resume in place from their checkpoints (they wait for budget while one
    that applies is still reached). The jobs resumed; [] for any other run."""
    if not run_stopped_by_budget(run):
        return []
    return run_resume_budget_stopped(run_id=run.pk)

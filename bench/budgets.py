"""(budgets) What the budgets add to the control plane's periodic work: the
check (``budgets_enforce``, from beat every TRAINYARD_BUDGET_CHECK_SECONDS)
over 1,000 running jobs, and the scheduler's holds (``Holds.read``) for a
pass of 100 pending jobs. Seeded in this process (Django on the bench
stack's database): 10 workspaces, each with a workspace budget and a budget
for each of its 5 members (a GPU quota included), 100 running jobs each on
a machine of their own, a tenth of the runs with a ``max_cost``, and the
month's history (ended attempts on terminated machines, ``--budget-history``
of them). Every limit is far above the spend: the check reads everything
and stops nothing. p50 of ``--samples`` checks, after one warm-up, and the
queries each makes."""

from __future__ import annotations

import statistics
import time
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any
from unittest import mock

from bench.lib import log

TARGET_MS = 50.0
WORKSPACES = 10
MEMBERS = 5
RUNNING_PER_WORKSPACE = 100
PENDING = 100


def bench_budgets(database_url: str, samples: int, history: int) -> dict[str, Any]:
    """Seed, then measure the check and the holds (the stack drops its database afterwards)."""
    from bench.runs_list import _django

    _django(database_url)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from backend.accounts.models import Workspace
    from backend.billing.selectors import month_spend
    from backend.runs.scheduler.holds import Holds
    from backend.runs.services.budgets import budgets_enforce

    started = time.monotonic()
    pending = _seed(history)
    seed_s = round(time.monotonic() - started, 1)
    running = WORKSPACES * RUNNING_PER_WORKSPACE
    log(f"(budgets) {running:,} running jobs, {history:,} ended attempts this month seeded in {seed_s} s")

    def measure(call: Any) -> dict[str, Any]:
        call()  # warm-up
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1000)
        with CaptureQueriesContext(connection) as queries:
            result = call()
        return {
            "p50_ms": round(statistics.median(times), 1),
            "max_ms": round(max(times), 1),
            "queries": len(queries),
        }, result

    check, enforced = measure(budgets_enforce)
    assert not enforced.stopped, f"the bench's budgets are far above the spend, yet {enforced.stopped} were stopped"
    workspaces = list(Workspace.objects.filter(slug__startswith="bench-budgets-").values_list("pk", flat=True))
    spend, given = measure(lambda: month_spend(workspace_ids=workspaces))
    # The check's own part: the same check, the month's spend handed to it as just read.
    with mock.patch("backend.runs.services.budgets.month_spend", lambda **_: given):
        own, _ = measure(budgets_enforce)
    holds, _ = measure(lambda: Holds.read(pending))
    result = {"running": running, "history": history, "pending": len(pending), "seed_seconds": seed_s}
    result.update(check=check, spend=spend, own=own, holds=holds)
    log(f"(budgets) check over {running:,} running jobs: {check}, of which the month's spend {spend}")
    log(f"(budgets) holds of a pass of {len(pending)} (the spend read once per check interval): {holds}")
    return result


def _seed(history: int) -> list[uuid.UUID]:
    """The workspaces, members, budgets, running jobs and history; the pending jobs' ids."""
    from django.db import connection
    from django.utils import timezone

    from backend.accounts.models import Membership, Role, User, Workspace
    from backend.billing.models import Budget
    from backend.clouds.models import Instance, InstanceStatus
    from backend.runs.models import Attempt, AttemptStatus, Job, Run, RunStatus

    now = timezone.now()
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    span = max((now - month).total_seconds() - 3600, 60.0)
    pending: list[uuid.UUID] = []
    per_workspace = history // WORKSPACES
    for w in range(WORKSPACES):
        ws = Workspace.objects.create(slug=f"bench-budgets-{w}", name=f"Bench budgets {w}")
        users = [User.objects.create(username=f"bench-budgets-{w}-{m}") for m in range(MEMBERS)]
        Membership.objects.bulk_create([Membership(workspace=ws, user=u, role=Role.MEMBER) for u in users])
        Budget.objects.create(workspace=ws, monthly_limit=Decimal("9999999"))
        Budget.objects.bulk_create(
            [Budget(workspace=ws, user=u, monthly_limit=Decimal("9999999"), gpu_quota=64) for u in users]
        )
        total = RUNNING_PER_WORKSPACE + per_workspace + PENDING // WORKSPACES
        runs = Run.objects.bulk_create(
            [
                Run(
                    workspace=ws,
                    name=f"bench-{w}-{n}",
                    workflow="train",
                    submitted_by=users[n % MEMBERS],
                    status=RunStatus.RUNNING,
                    max_cost=Decimal("999999") if n % 10 == 0 else None,
                )
                for n in range(total)
            ]
        )
        jobs = Job.objects.bulk_create(
            [
                Job(
                    workspace=ws,
                    run=run,
                    name="train",
                    workflow="train",
                    spec={},
                    gpu_count=1,
                    status=_job_status(n, per_workspace),
                    attempt=1 if n < RUNNING_PER_WORKSPACE + per_workspace else 0,
                )
                for n, run in enumerate(runs)
            ]
        )
        machines = Instance.objects.bulk_create(
            [
                Instance(
                    workspace=ws,
                    backend="fake",
                    name=f"bench-{w}-{n}",
                    token_hash=uuid.uuid4().hex,
                    price_per_hour=Decimal("2.5"),
                    running_at=month + timedelta(seconds=span * n / total),
                    terminated_at=None if n < RUNNING_PER_WORKSPACE else now - timedelta(minutes=30),
                    status=InstanceStatus.BUSY if n < RUNNING_PER_WORKSPACE else InstanceStatus.TERMINATED,
                    last_heartbeat_at=now,
                )
                for n in range(RUNNING_PER_WORKSPACE + per_workspace)
            ]
        )
        Attempt.objects.bulk_create(
            [
                Attempt(
                    workspace=ws,
                    job=job,
                    number=1,
                    instance=machine,
                    status=AttemptStatus.RUNNING if n < RUNNING_PER_WORKSPACE else AttemptStatus.ENDED,
                    started_at=machine.running_at,
                    finished_at=machine.terminated_at,
                )
                for n, (job, machine) in enumerate(zip(jobs, machines, strict=False))
            ]
        )
        pending += [j.pk for j in jobs[RUNNING_PER_WORKSPACE + per_workspace :]]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return pending


def _job_status(n: int, history: int) -> str:
    """The n-th job of a workspace: running, then the history's (finished), then pending."""
    if n < RUNNING_PER_WORKSPACE:
        return "running"
    return "succeeded" if n < RUNNING_PER_WORKSPACE + history else "pending"


def budget_rows(r: dict[str, Any], row: Any) -> None:
    """The table's rows: the check (all of it, and its own part without the
    month's spend read, which billing.selectors.month_spend answers) and a
    pass's holds, against the target."""
    row(
        f"budgets: the check over {r['running']:,} running jobs ({r['history']:,} ended attempts this month)",
        f"{r['check']['p50_ms']:.1f} ms, {r['check']['queries']} queries",
        f"≤ {TARGET_MS:.0f} ms",
        r["check"]["p50_ms"] <= TARGET_MS,
    )
    row(
        "budgets: of which the month's spend read (billing.selectors.month_spend)",
        f"{r['spend']['p50_ms']:.1f} ms, {r['spend']['queries']} queries",
        "(no target of its own)",
        None,
    )
    row(
        "budgets: the check's own part (the same check, the month's spend given)",
        f"{r['own']['p50_ms']:.1f} ms, {r['own']['queries']} queries",
        f"≤ {TARGET_MS:.0f} ms",
        r["own"]["p50_ms"] <= TARGET_MS,
    )
    row(
        f"budgets: the holds of a scheduling pass of {r['pending']} pending jobs",
        f"{r['holds']['p50_ms']:.1f} ms, {r['holds']['queries']} queries",
        f"≤ {TARGET_MS:.0f} ms",
        r["holds"]["p50_ms"] <= TARGET_MS,
    )

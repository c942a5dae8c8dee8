"""Costs read from the rows: an attempt's, a job's and a run's (the sum over
every attempt, interrupted ones included), the workspace's report and idle
line, each checked to the cent against hand-computed values."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from backend.accounts.models import Workspace
from backend.billing.selectors import (
    attempt_bills,
    cost_report,
    dangerously_all_workspaces_running_cost_per_hour,
    idle_line,
    job_costs,
    month_spend,
    run_costs,
)
from backend.clouds.models import Instance, InstanceStatus
from backend.runs.models import Attempt, AttemptStatus, Job, Run
from tests.support.fixtures import Person, submit

T = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
NOW = T + timedelta(hours=5)


def at(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def machine(
    workspace: Workspace, price: str, start: float, end: float | None, *, backend: str = "aws", spot: bool = True
) -> Instance:
    pk = uuid.uuid4()
    return Instance.objects.create(
        id=pk,
        workspace=workspace,
        backend=backend,
        name=f"m-{pk.hex[:6]}",
        token_hash=pk.hex,
        spot=spot,
        market="spot" if spot else "on-demand",
        price_per_hour=Decimal(price),
        running_at=at(start),
        terminated_at=None if end is None else at(end),
        status=InstanceStatus.BUSY if end is None else InstanceStatus.TERMINATED,
    )


def attempt(job: Job, number: int, on: Instance, start: float, end: float | None) -> Attempt:
    return Attempt.objects.create(
        workspace=job.workspace,
        job=job,
        number=number,
        instance=on,
        status=AttemptStatus.RUNNING if end is None else AttemptStatus.ENDED,
        started_at=at(start),
        finished_at=None if end is None else at(end),
    )


@pytest.fixture
def spot_run(team: Workspace, run: Run) -> Run:
    """Attempt 1 ran 1000 s on a $2.5236/h spot machine and was interrupted;
    attempt 2 has run 1800 s on a $0.9648/h one and still runs (at NOW)."""
    job = run.jobs.get()
    first = machine(team, "2.5236", 0, 1010)
    attempt(job, 1, first, 10, 1010)
    second = machine(team, "0.9648", NOW.timestamp() - T.timestamp() - 1830, None)
    attempt(job, 2, second, NOW.timestamp() - T.timestamp() - 1800, None)
    return run


def test_a_two_attempt_spot_runs_cost_is_the_sum_of_its_attempts(spot_run: Run) -> None:
    job = spot_run.jobs.get()
    one, two = job.attempts.order_by("number")
    bills = attempt_bills([one.pk, two.pk], now=NOW)
    # 2.5236 x 1000 / 3600 = 0.701; 0.9648 x 1800 / 3600 = 0.4824.
    assert (bills[one.pk].seconds, bills[one.pk].cost) == (1000, Decimal("0.7010"))
    assert (bills[two.pk].seconds, bills[two.pk].cost) == (1800, Decimal("0.4824"))
    assert bills[two.pk].price_per_hour == Decimal("0.9648")
    assert run_costs([spot_run.pk], now=NOW) == {spot_run.pk: Decimal("1.1834")}
    assert job_costs([job.pk], now=NOW) == {job.pk: Decimal("1.1834")}
    # Live: an hour later attempt 2 has held its machine 5400 s: 0.9648 x 1.5 = 1.4472.
    assert run_costs([spot_run.pk], now=NOW + timedelta(hours=1)) == {spot_run.pk: Decimal("2.1482")}


def test_a_page_of_runs_costs_one_query(team: Workspace, owner: Person, spot_run: Run) -> None:
    others = [submit(team, owner.user) for _ in range(3)]
    for n, other in enumerate(others):
        attempt(other.jobs.get(), 1, machine(team, "3.6", 0, 100), 0, 10 * (n + 1))
    with CaptureQueriesContext(connection) as queries:
        costs = run_costs([spot_run.pk, *(o.pk for o in others)], now=NOW)
    assert len(queries) == 1
    assert [costs[o.pk] for o in others] == [Decimal("0.0100"), Decimal("0.0200"), Decimal("0.0300")]


def test_a_run_that_never_held_a_machine_has_no_cost(run: Run) -> None:
    assert run_costs([run.pk], now=NOW) == {}


def test_a_reused_machines_idle_time_goes_to_the_idle_line(team: Workspace, owner: Person) -> None:
    # One $3.60/h machine from 0 to 1000 s; run A's job held it 100..400, run B's 600..900.
    shared = machine(team, "3.6", 0, 1000, spot=False)
    a, b = submit(team, owner.user), submit(team, owner.user, workflow="hello")
    attempt(a.jobs.get(), 1, shared, 100, 400)
    attempt(b.jobs.get(), 1, shared, 600, 900)
    # A 20 s machine bills 60 s: $0.06 at $3.60/h, all of it idle (no attempt).
    machine(team, "3.6", 2000, 2020)
    costs = run_costs([a.pk, b.pk], now=NOW)
    assert costs == {a.pk: Decimal("0.3000"), b.pk: Decimal("0.3000")}
    assert idle_line(workspace=team, since=T, until=NOW, now=NOW) == Decimal("0.4600")
    report = cost_report(workspace=team, since=T, until=NOW, by="user", now=NOW)
    assert (report.total, report.idle) == (Decimal("1.0600"), Decimal("0.4600"))
    assert [(r.key, r.cost) for r in report.rows] == [(owner.user.username, Decimal("0.6000"))]


def test_the_report_groups_by_workflow_backend_and_day(team: Workspace, owner: Person, spot_run: Run) -> None:
    local = machine(team, "0", 100, 400, backend="local", spot=False)
    other = submit(team, owner.user, workflow="hello")
    attempt(other.jobs.get(), 1, local, 100, 400)
    by_backend = cost_report(workspace=team, since=T, until=NOW, by="backend", now=NOW)
    assert [(r.key, r.cost) for r in by_backend.rows] == [("aws", Decimal("1.1834")), ("local", Decimal("0"))]
    by_day = cost_report(workspace=team, since=T, until=NOW, by="day", now=NOW)
    assert [(r.key, r.cost) for r in by_day.rows] == [("2026-11-02", Decimal("1.1834"))]
    # Before the window: nothing.
    empty = cost_report(workspace=team, since=T - timedelta(days=2), until=T, by="workflow", now=NOW)
    assert (empty.total, empty.idle, empty.rows) == (Decimal(0), Decimal(0), [])


def test_another_workspaces_costs_are_not_in_the_report(team: Workspace, outsider: Person, spot_run: Run) -> None:
    theirs = outsider.user.personal_workspace
    report = cost_report(workspace=theirs, since=T, until=NOW, by="user", now=NOW)
    assert (report.total, report.rows) == (Decimal(0), [])


def test_the_running_set_costs_its_live_machines_price_per_hour(team: Workspace, spot_run: Run) -> None:
    assert dangerously_all_workspaces_running_cost_per_hour() == {team.slug: Decimal("0.9648")}


def test_the_months_spend_counts_the_workspace_with_its_idle_line_and_each_submitter(
    team: Workspace, owner: Person, member: Person, spot_run: Run
) -> None:
    theirs = submit(team, member.user)
    shared = machine(team, "3.6", 0, 1000, spot=False)
    attempt(theirs.jobs.get(), 1, shared, 100, 400)  # $0.30 of $1.00: $0.70 idle
    spend = month_spend(workspace_ids=[team.pk], now=NOW)
    # spot_run (the owner's): 0.7010 + 0.4824 (still running at $0.9648/h).
    assert spend[(team.pk, owner.user.pk)].spent == Decimal("1.1834")
    assert spend[(team.pk, owner.user.pk)].rate == Decimal("0.9648")
    assert spend[(team.pk, member.user.pk)].spent == Decimal("0.3000")
    assert spend[(team.pk, member.user.pk)].rate == Decimal(0)
    # The first spot machine ran 1010 s for a 1000 s attempt: 0.0070 idle; the second 30 s before its attempt.
    idle = Decimal("0.0070") + Decimal("0.7000") + Decimal("0.0080")
    assert spend[(team.pk, None)].spent == Decimal("1.4834") + idle
    assert spend[(team.pk, None)].rate == Decimal("0.9648")
    # December counts December's attempts and idle only; the machine still running is still the rate.
    december = month_spend(workspace_ids=[team.pk], now=NOW + timedelta(days=30))[(team.pk, None)]
    assert (december.spent, december.rate) == (Decimal(0), Decimal("0.9648"))

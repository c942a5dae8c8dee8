"""The rollup the reports read gives exactly the row-by-row numbers: over
random histories of machines and attempts (open ones, ones their machine cut
short, half-second ends, machines revived, prices changed, attempts removed,
a submitter gone), after every change, for windows that cut days anywhere;
its backfill rebuilds what the triggers kept; two attempts ending at once
are both counted."""

from __future__ import annotations

import random
import threading
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction

from backend.accounts.models import Workspace
from backend.billing import rollup, rowwise
from backend.billing.models import CostDay
from backend.billing.selectors import cost_report, month_spend, month_start
from backend.clouds.models import Instance, InstanceStatus
from backend.runs.models import Attempt, AttemptStatus, Job, Run
from tests.support.fixtures import Person, submit

NOW = datetime(2026, 11, 20, 15, 30, 12, 345678, tzinfo=UTC)
KEYS = rowwise.KEYS


def _when(rng: random.Random) -> datetime:
    """A time from three weeks before NOW to NOW, sometimes on a half second
    (rounded half to even) or a day's edge."""
    at = NOW - timedelta(seconds=rng.randrange(21 * 86400))
    pick = rng.random()
    if pick < 0.2:
        return at.replace(microsecond=500000)
    if pick < 0.3:
        return at.replace(hour=0, minute=0, second=0, microsecond=0)
    return at.replace(microsecond=rng.randrange(1_000_000))


def _machine(rng: random.Random, team: Workspace) -> Instance:
    pk = uuid.uuid4()
    running = None if rng.random() < 0.1 else _when(rng)
    ended = running is not None and rng.random() < 0.6
    return Instance.objects.create(
        id=pk,
        workspace=team,
        backend=rng.choice(["aws", "local", "selfhosted"]),
        name=f"m-{pk.hex[:6]}",
        token_hash=pk.hex,
        price_per_hour=Decimal(rng.randrange(0, 9_000_000)) / 1_000_000,
        running_at=running,
        terminated_at=running + timedelta(seconds=rng.randrange(1, 40_000), microseconds=rng.randrange(1_000_000))
        if ended and running is not None
        else None,
        status=InstanceStatus.TERMINATED if ended else InstanceStatus.BUSY,
    )


def _attempt(rng: random.Random, job: Job, on: Instance | None, number: int) -> Attempt:
    started = None if rng.random() < 0.05 else _when(rng)
    if on is not None and on.running_at is not None and started is not None and rng.random() < 0.7:
        started = on.running_at + timedelta(seconds=rng.randrange(0, 3000), microseconds=rng.randrange(1_000_000))
    finished = None
    if started is not None and rng.random() < 0.7:
        finished = started + timedelta(seconds=rng.randrange(0, 20_000), microseconds=rng.choice([0, 500000, 123456]))
    return Attempt.objects.create(
        workspace=job.workspace,
        job=job,
        number=number,
        instance=on,
        status=AttemptStatus.RUNNING if finished is None else AttemptStatus.ENDED,
        started_at=started,
        finished_at=finished,
    )


def _change(rng: random.Random, team: Workspace, runs: list[Run]) -> str:
    """One change of what costs rest on, as the server (or a person) makes it."""
    attempts = list(Attempt.objects.filter(workspace=team))
    machines = list(Instance.objects.filter(workspace=team))
    what = rng.choice(["end", "terminate", "revive", "price", "remove", "unassign", "submitter", "workflow", "move"])
    if what == "end" and attempts:
        a = rng.choice(attempts)
        Attempt.objects.filter(pk=a.pk).update(
            finished_at=(a.started_at or NOW) + timedelta(seconds=rng.random() * 9e3)
        )
    elif what == "terminate" and machines:
        m = rng.choice(machines)
        end = (m.running_at or NOW) + timedelta(seconds=rng.randrange(1, 30_000), microseconds=rng.randrange(10**6))
        Instance.objects.filter(pk=m.pk).update(terminated_at=end, status=InstanceStatus.TERMINATED)
    elif what == "revive" and machines:
        Instance.objects.filter(pk=rng.choice(machines).pk).update(terminated_at=None, status=InstanceStatus.IDLE)
    elif what == "price" and machines:
        m = rng.choice(machines)
        Instance.objects.filter(pk=m.pk).update(price_per_hour=Decimal(rng.randrange(10**7)) / 10**6)
    elif what == "remove" and attempts:
        rng.choice(attempts).delete()
    elif what == "unassign" and attempts:
        Attempt.objects.filter(pk=rng.choice(attempts).pk).update(instance=None)
    elif what == "submitter":
        Run.objects.filter(pk=rng.choice(runs).pk).update(submitted_by=None)
    elif what == "workflow":
        Run.objects.filter(pk=rng.choice(runs).pk).update(workflow=rng.choice(["train", "eval", "hello"]))
    elif what == "move" and attempts and machines:
        Attempt.objects.filter(pk=rng.choice(attempts).pk).update(instance=rng.choice(machines))
    return what


def _windows(rng: random.Random) -> list[tuple[datetime, datetime]]:
    cut = _when(rng)
    return [
        (rng.choice([month_start(NOW), NOW - timedelta(days=30)]), NOW),
        (cut, cut + timedelta(days=rng.randrange(0, 12), seconds=rng.randrange(86400), microseconds=7)),
        (datetime(2026, 11, 3, tzinfo=UTC), datetime(2026, 11, 10, tzinfo=UTC)),
    ]


def _assert_equal(team: Workspace, rng: random.Random, story: list[str]) -> None:
    for since, until in _windows(rng):
        for by in rng.sample(KEYS, 2):
            report = cost_report(workspace=team, since=since, until=until, by=by, now=NOW)
            sums, idle = rowwise.report_sums(workspace=team, since=since, until=until, by=by, now=NOW)
            assert dict((r.key, r.cost) for r in report.rows) == sums, (story, since, until, by)
            assert report.idle == idle, (story, since, until)
            assert report.total == sum(sums.values(), Decimal(0)) + idle
    spend = month_spend(workspace_ids=[team.pk], now=NOW)
    expected = rowwise.spent_since(workspace_ids=[team.pk], since=month_start(NOW), now=NOW)
    assert {key: value.spent for key, value in spend.items() if key in expected or value.spent} == expected, story


def test_the_rollup_equals_the_row_by_row_costs_over_random_histories(
    team: Workspace, owner: Person, member: Person
) -> None:
    runs = [submit(team, who.user) for who in (owner, member, owner, member)]
    jobs = [r.jobs.get() for r in runs]
    number = 0
    for seed in range(40):
        rng = random.Random(seed)
        Attempt.objects.filter(workspace=team).delete()
        Instance.objects.filter(workspace=team).delete()
        machines = [_machine(rng, team) for _ in range(rng.randrange(1, 7))]
        for _ in range(rng.randrange(1, 14)):
            number += 1
            _attempt(
                rng,
                rng.choice(jobs),
                rng.choice([*machines, None]) if rng.random() < 0.1 else rng.choice(machines),
                number,
            )
        story = [f"seed {seed}"]
        _assert_equal(team, rng, story)
        for _ in range(rng.randrange(1, 6)):
            story.append(_change(rng, team, runs))
            _assert_equal(team, rng, story)
    # Every bucket still counted only what its rows hold: nothing negative was left behind.
    assert not CostDay.objects.filter(items__lt=0).exists()


def test_the_backfill_rebuilds_what_the_triggers_kept(team: Workspace, owner: Person, member: Person) -> None:
    runs = [submit(team, who.user) for who in (owner, member)]
    rng = random.Random(7)
    machines = [_machine(rng, team) for _ in range(6)]
    for n in range(30):
        _attempt(rng, rng.choice(runs).jobs.get(), rng.choice(machines), n + 1)
    for _ in range(10):
        _change(rng, team, runs)
    kept = _buckets()
    with connection.cursor() as cursor:
        cursor.execute(rollup.REBUILD)
    assert _buckets() == kept
    assert kept  # the history settled something


def _buckets() -> dict[tuple[object, ...], tuple[Decimal, int]]:
    rows = CostDay.objects.values_list("workspace_id", "day", "kind", "user_id", "workflow", "backend", "cost", "items")
    return {tuple(key): (cost, items) for *key, cost, items in rows if items or cost}


@pytest.mark.django_db(transaction=True)
def test_two_attempts_of_a_workspace_ending_at_once_are_both_counted(team: Workspace, owner: Person) -> None:
    # Two jobs of the same user and workflow on one $3.60/h machine, each 1000 s: one bucket, two writers.
    first, second = submit(team, owner.user), submit(team, owner.user)
    start = NOW.replace(hour=9, minute=0, second=0, microsecond=0)
    shared = Instance.objects.create(
        workspace=team, backend="aws", name="shared", token_hash="shared", price_per_hour=Decimal("3.6"),
        running_at=start, status=InstanceStatus.BUSY,
    )  # fmt: skip
    attempts = [
        Attempt.objects.create(workspace=team, job=r.jobs.get(), number=1, instance=shared, started_at=start)
        for r in (first, second)
    ]
    barrier = threading.Barrier(2)

    def end(attempt: Attempt) -> None:
        try:
            with transaction.atomic():
                barrier.wait(timeout=10)
                Attempt.objects.filter(pk=attempt.pk).update(finished_at=start + timedelta(seconds=1000))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=end, args=(a,)) for a in attempts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    day = CostDay.objects.get(workspace_id=team.pk, kind="a")
    assert (day.cost, day.items) == (Decimal("2.0000"), 2)
    report = cost_report(workspace=team, since=month_start(NOW), until=NOW, by="user", now=NOW)
    assert [(r.key, r.cost) for r in report.rows] == [(owner.user.username, Decimal("2.0000"))]
    # The machine ends after 3000 s ($3.00): what the two attempts did not hold is its idle share, settled once.
    Instance.objects.filter(pk=shared.pk).update(terminated_at=start + timedelta(seconds=3000))
    report = cost_report(workspace=team, since=month_start(NOW), until=NOW, by="user", now=NOW)
    assert (report.idle, report.total) == (Decimal("1.0000"), Decimal("3.0000"))

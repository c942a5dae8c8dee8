"""Scheduling passes coalesce (real Postgres and Redis): a pass never waits
for the scheduler's lock, and a request made while a pass runs is served
by the next pass (backend/runs/scheduler/coalesce.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connections

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.core.redis import redis_client
from backend.runs import wakeups
from backend.runs.models import Job, JobStatus, Run
from backend.runs.scheduler import claim
from backend.runs.scheduler.coalesce import schedule_passes
from backend.runs.scheduler.passes import SCHEDULER_LOCK, ScheduleResult, jobs_schedule
from backend.runs.wakeups import DIRTY_KEY, PASSES_KEY, QUEUED_KEY
from tests.support.testdb import django_test_db_connect

pytestmark = pytest.mark.django_db(transaction=True)


KEYS = (DIRTY_KEY, QUEUED_KEY, PASSES_KEY, "celery")  # "celery": the queue the submissions' requests went to


@pytest.fixture(autouse=True)
def _flags(run: Run) -> Iterator[None]:
    """After the run's submission asked for its pass: no request pending."""
    redis_client().delete(*KEYS)
    yield
    redis_client().delete(*KEYS)


@pytest.fixture
def lock_held() -> Iterator[None]:
    """Another pass, on a connection of its own, holds the scheduler's lock."""
    with django_test_db_connect() as other:
        other.execute("SELECT pg_advisory_lock(%s)", [SCHEDULER_LOCK])
        other.commit()
        yield


def _idle(team: Workspace) -> Instance:
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name="local-c",
        token_hash="c" * 64,
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**30,
        channel_name="test-channel",
    )


def _dirty() -> bool:
    return bool(redis_client().exists(DIRTY_KEY))


def test_a_pass_never_waits_for_the_schedulers_lock(run: Run, lock_held: None) -> None:
    result: list[ScheduleResult] = []

    def other_pass() -> None:
        try:
            result.append(jobs_schedule())
        finally:
            connections.close_all()

    started = time.monotonic()
    thread = threading.Thread(target=other_pass, daemon=True)
    thread.start()
    thread.join(timeout=5)

    assert not thread.is_alive(), "the pass waited for the lock"
    assert time.monotonic() - started < 5
    assert result[0].busy and result[0].assigned == []
    assert run.jobs.get().status == JobStatus.PENDING


def test_no_request_no_pass_and_one_request_one_pass(team: Workspace, run: Run) -> None:
    _idle(team)
    assert schedule_passes() == 0  # nothing asked
    assert run.jobs.get().status == JobStatus.PENDING

    redis_client().set(DIRTY_KEY, 1)
    assert schedule_passes() == 1
    assert run.jobs.get().status == JobStatus.ASSIGNED
    assert not _dirty()
    assert int(redis_client().get(PASSES_KEY) or 0) == 1


def test_a_busy_pass_leaves_the_request_for_the_holder(team: Workspace, run: Run, lock_held: None) -> None:
    _idle(team)
    redis_client().set(DIRTY_KEY, 1)

    assert schedule_passes() == 0  # returns at once: the holder runs it
    assert _dirty()
    assert run.jobs.get().status == JobStatus.PENDING


def test_a_job_submitted_during_a_pass_is_scheduled_by_the_next_pass(
    team: Workspace, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second job arrives (and asks for a pass) after the pass read the
    pending jobs: the same task runs one more pass for it."""
    (
        _idle(team),
        Instance.objects.create(
            workspace=team,
            backend="local",
            name="local-d",
            token_hash="d" * 64,
            status=InstanceStatus.IDLE,
            cpus=2,
            memory_bytes=2**30,
            channel_name="test-channel-2",
        ),
    )
    first = run.jobs.get()
    ready = claim._ready
    late: list[Job] = []

    def submit_during_the_pass(job: Job) -> bool:
        if not late:
            copy = Job.objects.get(pk=first.pk)
            copy.pk, copy.name = None, "late"
            copy.save()
            late.append(copy)
            wakeups.flags_call(wakeups._mark_dirty)  # what its submission's on_commit does
        return ready(job)

    monkeypatch.setattr(claim, "_ready", submit_during_the_pass)
    redis_client().set(DIRTY_KEY, 1)

    assert schedule_passes() == 2
    assert {j.name: j.status for j in Job.objects.filter(run=run)} == {
        first.name: JobStatus.ASSIGNED,
        "late": JobStatus.ASSIGNED,
    }
    assert not _dirty()

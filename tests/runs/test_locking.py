"""Row locks under real concurrency: two transactions (threads, each with its
own Postgres connection) forced into the interleaving that used to go wrong
with a barrier. docs/RUNS.md, "Locks"."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.core.db import retry_on_conflict
from backend.runs.lifecycle import transitions
from backend.runs.models import Job, JobStatus, Run, RunStatus
from backend.runs.scheduler import claim
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.reconcile import runs_repair_finished
from backend.runs.services.runs import run_stop
from tests.support.attempts import accept, report
from tests.support.fixtures import Person
from tests.support.testdb import django_test_db_connect
from tests.support.threads import in_thread

pytestmark = pytest.mark.django_db(transaction=True)

BARRIER_SECONDS = 3.0


def _instance(team: Workspace, name: str) -> Instance:
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name=name,
        token_hash=name.ljust(64, "h"),
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**30,
        channel_name=f"test-{name}",
    )


def _two_jobs(run: Run) -> list[Job]:
    """The run's job and a copy of it: two jobs that can run side by side."""
    first = run.jobs.get()
    second = Job.objects.get(pk=first.pk)
    second.pk = None
    second.name = "hello-2"
    second.save()
    return list(run.jobs.order_by("pk"))


def _wait(barrier: threading.Barrier) -> None:
    """Meet the other thread, unless it is blocked on a lock we hold (the
    fixed code): then go on after a while."""
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=BARRIER_SECONDS)


def test_two_jobs_finishing_at_once_finish_their_run(team: Workspace, run: Run) -> None:
    jobs = _two_jobs(run)
    instances = [_instance(team, "a"), _instance(team, "b")]
    jobs_schedule()
    for job in jobs:
        job.refresh_from_db()
        assert accept(job, job.instance_id)
    barrier = threading.Barrier(2)

    def finish(job: Job) -> Callable[[], bool]:
        def work() -> bool:
            with transaction.atomic():  # one transaction finishes the job, then waits for the other
                done = report(job, job.instance_id, "succeeded", 0)
                _wait(barrier)
            return done

        return work

    joins = [in_thread(finish(job)) for job in jobs]
    assert [join() for join in joins] == [True, True]

    run.refresh_from_db()
    assert {j.status for j in run.jobs.all()} == {JobStatus.SUCCEEDED}
    assert (run.status, run.exit_code) == (RunStatus.SUCCEEDED, 0)
    assert len(instances) == 2


def test_a_job_and_its_run_finish_in_one_commit(team: Workspace, run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another connection looking right after the job's end committed (when
    its runner is released) sees the run finished too. The run used to be
    derived in a transaction of its own after it: a reader could see a
    finished job in a running run, and the reconciler "repaired" such runs
    under load, with a warning, several times in a 50-run burst."""
    instance = _instance(team, "a")
    jobs_schedule()
    job = run.jobs.get()
    assert accept(job, instance.pk)
    seen: list[tuple[str, str]] = []
    release = transitions._instance_job_done

    def look_then_release(instance_id: str, ended: Job, *, retire: bool = False) -> None:
        with django_test_db_connect() as other:
            row = other.execute(
                "SELECT r.status, j.status FROM runs_job j JOIN runs_run r ON r.id = j.run_id WHERE j.id = %s",
                [ended.pk],
            ).fetchone()
        assert row is not None
        seen.append((row[0], row[1]))
        release(instance_id, ended, retire=retire)

    monkeypatch.setattr(transitions, "_instance_job_done", look_then_release)
    assert report(job, instance.pk, "succeeded", 0)

    assert seen == [(RunStatus.SUCCEEDED, JobStatus.SUCCEEDED)]
    assert runs_repair_finished() == 0


def test_the_reconciler_repairs_a_run_left_running_with_all_jobs_finished(team: Workspace, run: Run) -> None:
    jobs = _two_jobs(run)
    Job.objects.filter(pk=jobs[0].pk).update(status=JobStatus.SUCCEEDED, exit_code=0)
    Job.objects.filter(pk=jobs[1].pk).update(status=JobStatus.FAILED, exit_code=3, status_reason="exited with code 3")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)  # what the old race left behind

    assert runs_repair_finished() == 1

    run.refresh_from_db()
    assert (run.status, run.exit_code, run.status_reason) == (RunStatus.FAILED, 3, "exited with code 3")
    assert runs_repair_finished() == 0


def test_a_stop_racing_a_scheduling_pass_neither_fails_nor_deadlocks(
    team: Workspace, run: Run, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass has claimed the run's pending jobs when the stop comes in
    (``runs stop`` right after a submission or a re-run). It used to lock
    the run last and the stop first: "deadlock detected", a 500 and a dead
    schedule task."""
    jobs = _two_jobs(run)
    _instance(team, "a"), _instance(team, "b")
    barrier = threading.Barrier(2)
    ready = claim._ready
    claimed = threading.Event()

    def ready_after_the_stop_began(job: Job) -> bool:
        if not claimed.is_set():  # first job of the pass: its rows are claimed
            claimed.set()
            _wait(barrier)
            time.sleep(0.5)  # the stop is under way: it holds (or waits for) the run's row
        return ready(job)

    monkeypatch.setattr(claim, "_ready", ready_after_the_stop_began)

    def stop() -> Run:
        _wait(barrier)
        return run_stop(run=Run.objects.get(pk=run.pk), user=owner.user)

    join_pass = in_thread(jobs_schedule)
    join_stop = in_thread(stop)
    result = join_pass()
    stopped = join_stop()

    assert not result.busy and stopped is not None
    run.refresh_from_db()
    statuses = {j.status for j in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    # Consistent: every job is being stopped or stopped, none left to start.
    assert statuses <= {JobStatus.STOPPING, JobStatus.STOPPED}, statuses
    assert run.status in (RunStatus.STOPPING, RunStatus.STOPPED)


def test_a_transaction_that_lost_a_real_deadlock_is_tried_again(team: Workspace) -> None:
    other = Workspace.objects.create(slug="other", name="Other")
    barrier = threading.Barrier(2)
    calls: list[int] = []

    @retry_on_conflict
    def rename_both() -> str:
        calls.append(1)
        with transaction.atomic():
            with connection.cursor() as cursor:
                # This side closes the cycle and checks first (100 ms): it is the one aborted.
                cursor.execute("SET LOCAL deadlock_timeout = '100ms'")
            Workspace.objects.filter(pk=team.pk).update(name="A1")
            if len(calls) == 1:
                barrier.wait(timeout=10)
                time.sleep(0.2)  # the other side waits for our row first; we close the cycle
            Workspace.objects.filter(pk=other.pk).update(name="B1")
        return "renamed"

    def opposite_order() -> None:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL deadlock_timeout = '10s'")
            Workspace.objects.filter(pk=other.pk).update(name="B2")
            barrier.wait(timeout=10)
            Workspace.objects.filter(pk=team.pk).update(name="A2")

    join = in_thread(opposite_order)
    assert rename_both() == "renamed"
    join()

    assert len(calls) == 2  # the first try lost the deadlock; the second won
    names = dict(Workspace.objects.filter(pk__in=[team.pk, other.pk]).values_list("slug", "name"))
    assert names == {"acme": "A1", "other": "B1"}  # the retry ran after the other committed

"""Warm start: a submission an idle runner fits is assigned in the request's
own transaction, its assignment sent when it commits, with no Celery hop;
what nothing idle fits waits for a pass. Real Postgres (row locks, two
connections) and the real channel layer. docs/RUNS.md, "Warm start"."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.utils import timezone
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.core.redis import redis_client
from backend.runs.events import publishing_held
from backend.runs.lifecycle.transitions import job_accept
from backend.runs.models import Attempt, Job, JobStatus, Run, RunStatus
from backend.runs.scheduler.claim import READY_GRACE_SECONDS
from backend.runs.scheduler.handover import instance_assign_next
from backend.runs.scheduler.passes import SCHEDULER_LOCK, jobs_schedule
from backend.runs.services import runs as runs_service
from backend.runs.wakeups import DIRTY_KEY, QUEUED_KEY
from tests.support.fixtures import Person, submit
from tests.support.runners import HELLO, runner_instance, runner_socket
from tests.support.testdb import django_test_db_connect
from tests.support.threads import in_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_requests() -> Iterator[None]:
    redis_client().delete(DIRTY_KEY, QUEUED_KEY, "celery")
    yield
    redis_client().delete(DIRTY_KEY, QUEUED_KEY, "celery")


def _idle(team: Workspace, name: str = "local-w") -> tuple[Instance, str]:
    """An idle, connected runner of the workspace and the channel its frames reach."""
    channel = async_to_sync(get_channel_layer().new_channel)()
    instance = Instance.objects.create(
        workspace=team,
        backend="local",
        name=name,
        token_hash=name.ljust(64, "w"),
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**30,
        channel_name=channel,
    )
    return instance, channel


def _frame(channel: str) -> protocol.AssignJob:
    message = async_to_sync(get_channel_layer().receive)(channel)
    return protocol.AssignJob.model_validate_json(message["frame"])


def _pass_requested() -> bool:
    return bool(redis_client().exists(DIRTY_KEY))


def test_a_submission_an_idle_runner_fits_is_assigned_and_sent_without_a_pass(team: Workspace, owner: Person) -> None:
    instance, channel = _idle(team)

    run = submit(team, owner.user, no_cache=True)

    job = run.jobs.get()
    instance.refresh_from_db()
    assert (job.status, job.instance_id, job.attempt) == (JobStatus.ASSIGNED, instance.pk, 1)
    assert instance.status == InstanceStatus.BUSY
    frame = _frame(channel)
    assert (frame.job, frame.attempt, frame.commands) == (str(job.pk), 1, ["echo hello"])
    # Named at the end of the transaction: the frame, built on commit, has the name the run is shown by.
    shown = Run.objects.values_list("name", flat=True).get(pk=run.pk)
    assert re.fullmatch(r"[a-z]+-[a-z]+-\d+", shown)
    assert (frame.run_name, frame.env["TRAINYARD_RUN_NAME"], run.name) == (shown, shown, shown)
    assert not _pass_requested()  # nothing waits: no Celery task on the hot path


# A warm start's submission: its transaction (run, job, claim, attempt, the
# run's refresh), the workspace's secret names (a secret the workflow names
# must exist), the database's clock (the attempt's lease) and, once it
# commits, the assignment frame and the run's publish, BEGIN and COMMIT counted. Each is ~1.5-2 ms of the submission on
# a 2-core machine (bench/results/2026-12-03-warm-start-traced-and-ingest.md).
# And the budgets: the estimate's offers (two reads of the workspace's
# accounts) and its update of each job at submission (admission), and the
# scheduler's holds (scheduler/holds.py: one query when the workspace has no budget).
WARM_SUBMISSION_QUERIES = 37


def test_a_warm_submission_makes_a_bounded_number_of_queries(
    team: Workspace, owner: Person, django_assert_max_num_queries: Any
) -> None:
    _idle(team)
    submit(team, owner.user, no_cache=True)  # the workspace's first run: its repo row is made
    _, channel = _idle(team, "local-x")

    with django_assert_max_num_queries(WARM_SUBMISSION_QUERIES):
        run = submit(team, owner.user, no_cache=True)

    assert run.jobs.get().status == JobStatus.ASSIGNED
    assert _frame(channel).job == str(run.jobs.get().pk)


# The runner's acceptance: the runner waits for its commit (the
# confirmation) before the commands start. BEGIN, the run's lock, the job's,
# the attempt and the job set running, the run refreshed, COMMIT.
ACCEPTANCE_QUERIES = 8


def test_an_acceptance_makes_a_bounded_number_of_queries(
    team: Workspace, owner: Person, django_assert_max_num_queries: Any
) -> None:
    instance, _ = _idle(team)
    run = submit(team, owner.user, no_cache=True)
    attempt = Attempt.objects.get(job__run=run)

    with publishing_held(), django_assert_max_num_queries(ACCEPTANCE_QUERIES):
        accepted = job_accept(job_id=str(attempt.job_id), instance_id=str(instance.pk), attempt=1, lease=attempt.lease)

    assert accepted
    run.refresh_from_db()
    job = run.jobs.get()
    assert (run.status, job.status, job.started_at) == (RunStatus.RUNNING, JobStatus.RUNNING, run.started_at)
    assert job.started_at is not None


def test_what_no_idle_runner_fits_waits_for_a_pass(team: Workspace, owner: Person) -> None:
    _idle(team)

    run = submit(team, owner.user, workflow="big")  # a V100: the idle runner has no GPU

    assert run.jobs.get().status == JobStatus.PENDING
    assert _pass_requested()


def test_only_the_jobs_that_are_ready_are_assigned_the_rest_wait_for_a_pass(team: Workspace, owner: Person) -> None:
    instance, channel = _idle(team)

    run = submit(team, owner.user, workflow="train", no_cache=True)  # train needs hello's artifacts

    hello, train = run.jobs.order_by("created_at")
    assert (hello.status, hello.instance_id) == (JobStatus.ASSIGNED, instance.pk)
    assert train.status == JobStatus.PENDING
    assert _frame(channel).job == str(hello.pk)
    assert _pass_requested()


def test_with_assign_on_submit_off_every_job_waits_for_a_pass(team: Workspace, owner: Person, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "ASSIGN_ON_SUBMIT": False}
    _idle(team)

    run = submit(team, owner.user, no_cache=True)

    assert run.jobs.get().status == JobStatus.PENDING
    assert _pass_requested()


def _timed_submission_in_a_thread(team: Workspace, owner: Person) -> tuple[Run, float]:
    """A submission on a connection of its own, and how long it took."""

    def submission() -> tuple[Run, float]:
        started = time.monotonic()
        run = submit(team, owner.user, no_cache=True)
        return run, time.monotonic() - started

    result: tuple[Run, float] = in_thread(submission)()
    return result


def test_a_submission_does_not_wait_for_a_runner_another_transaction_holds(team: Workspace, owner: Person) -> None:
    """A pass (or another submission) holds the only idle runner's row, its
    transaction still open: the submission neither queues behind it (``SKIP
    LOCKED``) nor takes the same runner; its job is left to the next pass."""
    instance, _ = _idle(team)
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with transaction.atomic():
            Instance.objects.select_for_update().get(pk=instance.pk)
            holding.set()
            release.wait(timeout=30)

    join_holder = in_thread(hold)
    assert holding.wait(timeout=30)

    try:
        run, took = _timed_submission_in_a_thread(team, owner)
    finally:
        release.set()
    join_holder()

    assert took < 10, f"the submission waited {took:.1f}s for the transaction holding the runner"
    assert (run.jobs.get().status, run.jobs.get().instance_id) == (JobStatus.PENDING, None)
    assert _pass_requested()


def test_a_submission_does_not_wait_for_another_one_still_in_its_transaction(
    team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two submissions to one workspace: the first is held inside its
    transaction (its run written, its runner claimed) while the second is
    assigned and committed. The runs' numbers stay gapless and follow the
    order the submissions committed in (the workspace's counter is taken by
    each one's last statement: it used to be the first, and the second
    waited for the first's commit)."""
    submit(team, owner.user, no_cache=True)  # the workspace's first run: its repo's row is made (number 1)
    _idle(team, "local-a")
    _idle(team, "local-b")
    inside, release = threading.Event(), threading.Event()
    assign = runs_service.run_assign_on_submit
    calls: list[str] = []

    def first_held(*, run: Run) -> list[Attempt]:
        attempts = assign(run=run)
        calls.append(str(run.pk))
        if len(calls) == 1:
            inside.set()
            release.wait(timeout=15)
        return attempts

    monkeypatch.setattr(runs_service, "run_assign_on_submit", first_held)
    join_first = in_thread(lambda: submit(team, owner.user, no_cache=True))
    assert inside.wait(timeout=30)

    try:
        second, took = _timed_submission_in_a_thread(team, owner)
    finally:
        release.set()
    first = join_first()

    assert took < 5, f"the submission waited {took:.1f}s for the other one's transaction"
    assert (second.name.rsplit("-", 1)[1], first.name.rsplit("-", 1)[1]) == ("2", "3")
    assert Run.objects.get(pk=first.pk).name == first.name
    jobs = [Job.objects.get(run=run) for run in (first, second)]
    assert [job.status for job in jobs] == [JobStatus.ASSIGNED, JobStatus.ASSIGNED], [j.status_reason for j in jobs]
    assert jobs[0].instance_id != jobs[1].instance_id


def test_a_gpu_job_takes_the_idle_runner_whose_gpu_fits_and_locks_no_other(team: Workspace, owner: Person) -> None:
    """A job's GPUs are checked in Python: its candidates are read first, then
    only the one that fits is locked. The runner without a GPU, idle longer,
    is passed over and stays free for the transactions beside this one."""
    cpu_only, _ = _idle(team, "local-cpu")
    gpu, channel = _idle(team, "local-gpu")
    Instance.objects.filter(pk=cpu_only.pk).update(idle_since=timezone.now() - timedelta(minutes=5))
    Instance.objects.filter(pk=gpu.pk).update(
        idle_since=timezone.now(), gpus=[{"name": "V100", "memory_bytes": 16 * 2**30}]
    )

    with transaction.atomic():  # the submission's locks are held until this block ends
        run = submit(team, owner.user, workflow="big", no_cache=True)
        with django_test_db_connect() as other:
            free = other.execute(
                "SELECT name FROM clouds_instance WHERE workspace_id = %s FOR UPDATE SKIP LOCKED", [team.pk]
            ).fetchall()

    assert free == [("local-cpu",)]
    assert run.jobs.get().instance_id == gpu.pk
    assert _frame(channel).job == str(run.jobs.get().pk)


def test_a_submission_is_assigned_while_a_pass_holds_the_schedulers_lock(team: Workspace, owner: Person) -> None:
    """The scheduler's lock serialises passes (launches, pool sizes); the
    warm path does not take it."""
    instance, channel = _idle(team)
    with django_test_db_connect() as other:
        other.execute("SELECT pg_advisory_lock(%s)", [SCHEDULER_LOCK])
        other.commit()

        run = submit(team, owner.user, no_cache=True)

        assert run.jobs.get().instance_id == instance.pk
        assert _frame(channel).job == str(run.jobs.get().pk)


# ---------------------------------------------------------------- hand-over


def _connect_runner(team: Workspace, name: str) -> tuple[Instance, WebsocketCommunicator]:
    return runner_instance(team, name, f"{name}-secret"), runner_socket(f"{name}-secret")


def test_a_runner_that_finished_its_job_is_sent_the_next_pending_one_at_once_without_a_pass(
    team: Workspace, owner: Person
) -> None:
    """The runner's final state hands it the oldest pending job it fits,
    passing over one it does not fit (a GPU job) and one that waits for its
    dependencies: no scheduling pass runs here (no worker does), yet the
    next assignment arrives right after the final state."""
    instance, ws = _connect_runner(team, "local-h")
    redis_client().delete(DIRTY_KEY, QUEUED_KEY)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_dump_json())
        await ws.receive_from(timeout=5)  # welcome
        # The hello's own hand-over holds the runner's row until it commits; the
        # pass it asks for last says it is over. A submission made before then
        # would pass the runner over, and no worker runs the pass here.
        await _until(lambda: bool(redis_client().exists(DIRTY_KEY)))
        first = await database_sync_to_async(submit)(team, owner.user, no_cache=True)
        assigned = json.loads(await ws.receive_from(timeout=5))
        await ws.send_to(
            text_data=protocol.JobAccepted(job=assigned["job"], attempt=1, lease=assigned["lease"]).model_dump_json()
        )
        await ws.receive_from(timeout=5)  # confirmed
        await database_sync_to_async(submit)(team, owner.user, workflow="big")  # a V100: not this runner
        await database_sync_to_async(submit)(team, owner.user, workflow="train", no_cache=True)  # hello, then train
        redis_client().delete(DIRTY_KEY, QUEUED_KEY, "celery")
        final = protocol.JobState(job=assigned["job"], attempt=1, state="succeeded", exit_code=0)
        await ws.send_to(text_data=final.model_dump_json())
        following = json.loads(await ws.receive_from(timeout=5))
        await ws.disconnect()
        return {"first": str((await database_sync_to_async(first.jobs.get)()).pk), **assigned}, following

    assigned, following = async_to_sync(scenario)()

    assert assigned["job"] == assigned["first"]
    run = Run.objects.get(workspace=team, workflow="train")
    hello_job, train_job = run.jobs.order_by("created_at")
    assert (following["type"], following["job"], following["attempt"]) == ("assign_job", str(hello_job.pk), 1)
    hello_job.refresh_from_db()
    assert (hello_job.status, hello_job.instance_id) == (JobStatus.ASSIGNED, instance.pk)
    assert train_job.status == JobStatus.PENDING  # its dependency has not run yet
    assert Run.objects.get(workspace=team, workflow="big").jobs.get().status == JobStatus.PENDING


def _two_pending_and_an_idle_runner(team: Workspace, owner: Person, settings: Any) -> tuple[Job, Job, Instance, str]:
    """An older and a newer pending job, submitted with the warm path off,
    and an idle runner that fits both, with the channel its frames reach."""
    settings.TRAINYARD = {**settings.TRAINYARD, "ASSIGN_ON_SUBMIT": False}
    older = submit(team, owner.user, no_cache=True).jobs.get()
    newer = submit(team, owner.user, no_cache=True).jobs.get()
    instance, channel = _idle(team)
    return older, newer, instance, channel


def test_the_hand_over_takes_the_oldest_job_the_runner_fits_and_nothing_when_it_is_off(
    team: Workspace, owner: Person, settings: Any
) -> None:
    older, newer, instance, channel = _two_pending_and_an_idle_runner(team, owner, settings)

    settings.TRAINYARD = {**settings.TRAINYARD, "ASSIGN_ON_IDLE": False}
    assert instance_assign_next(instance_id=str(instance.pk)) is None
    settings.TRAINYARD = {**settings.TRAINYARD, "ASSIGN_ON_IDLE": True}
    attempt = instance_assign_next(instance_id=str(instance.pk))

    assert attempt is not None and attempt.job_id == older.pk
    assert _frame(channel).job == str(older.pk)
    newer.refresh_from_db()
    assert newer.status == JobStatus.PENDING
    assert instance_assign_next(instance_id=str(instance.pk)) is None  # busy now


@pytest.mark.parametrize("by", ["pass", "hand-over"])
def test_a_machine_just_up_goes_to_the_job_it_was_started_for_not_an_older_one_it_also_fits(
    team: Workspace, owner: Person, settings: Any, by: str
) -> None:
    """The older job would take it first, and the job it was started for (a
    GPU job, say, behind a CPU one) would start another machine. For
    ``READY_GRACE_SECONDS`` it is that job's; after that, anyone's."""
    older, started_for, instance, channel = _two_pending_and_an_idle_runner(team, owner, settings)
    Instance.objects.filter(pk=instance.pk).update(requested_for=started_for, idle_since=timezone.now())

    if by == "pass":
        jobs_schedule()
    else:
        instance_assign_next(instance_id=str(instance.pk))

    assert _frame(channel).job == str(started_for.pk)
    assert Job.objects.get(pk=older.pk).status == JobStatus.PENDING


def test_a_machine_up_longer_than_the_grace_goes_to_the_oldest_job(
    team: Workspace, owner: Person, settings: Any
) -> None:
    older, started_for, instance, channel = _two_pending_and_an_idle_runner(team, owner, settings)
    up_since = timezone.now() - timedelta(seconds=READY_GRACE_SECONDS + 1)
    Instance.objects.filter(pk=instance.pk).update(requested_for=started_for, idle_since=up_since)

    jobs_schedule()

    assert _frame(channel).job == str(older.pk)
    assert Job.objects.get(pk=started_for.pk).status == JobStatus.PENDING


def test_a_pass_keeps_the_assignments_it_made_before_a_job_it_could_not_decide(
    team: Workspace, owner: Person, settings: Any
) -> None:
    """Each job is decided in its own transaction: a job whose decision
    fails (here its placement holds a price that is not a number) does not
    take back the assignment made to the job before it, which was sent."""
    settings.TRAINYARD = {**settings.TRAINYARD, "ASSIGN_ON_SUBMIT": False}
    good = submit(team, owner.user, no_cache=True).jobs.get()
    bad = submit(team, owner.user, no_cache=True).jobs.get()
    Job.objects.filter(pk=bad.pk).update(placement={"max_price": "cheap"})
    instance, channel = _idle(team)

    with pytest.raises(ValueError):
        jobs_schedule()

    good.refresh_from_db()
    assert (good.status, good.instance_id) == (JobStatus.ASSIGNED, instance.pk)
    assert _frame(channel).job == str(good.pk)
    assert Job.objects.get(pk=bad.pk).status == JobStatus.PENDING
    with django_test_db_connect() as other:  # the pass let go of the scheduler's lock
        assert other.execute("SELECT pg_try_advisory_lock(%s)", [SCHEDULER_LOCK]).fetchone() == (True,)


# A pass over a queue that waits for the local pool, per pending job: BEGIN,
# the job and its run claimed, its dependencies (two prefetches), an idle
# runner looked for, the instances requested for it, the pool's size, an
# idle runner of another workspace to retire, the offer blocks, COMMIT. The
# offers are ranked once per pass; a job with no attempt yet reads none.
PASS_QUERIES_PER_WAITING_JOB = 10


def test_a_pass_over_a_waiting_queue_makes_a_bounded_number_of_queries_per_job(
    team: Workspace, owner: Person, settings: Any, django_assert_max_num_queries: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": True, "LOCAL_RUNNERS_MAX": 2}
    for name in ("local-a", "local-b"):
        instance, _ = _idle(team, name)
        Instance.objects.filter(pk=instance.pk).update(status=InstanceStatus.BUSY)
    text = "workflows:\n  - name: hello\n    provider: bash\n    commands: [echo hello]\n"
    jobs = [submit(team, owner.user, text=text, commit=f"{i:040x}").jobs.get() for i in range(12)]
    jobs_schedule()  # the first pass records each job's cache decision

    # + the pass's own: its lock, the pending ids, the holds' read (one query without budgets), …
    with django_assert_max_num_queries(PASS_QUERIES_PER_WAITING_JOB * len(jobs) + 6):
        result = jobs_schedule()

    assert sorted(result.waiting) == sorted(str(j.pk) for j in jobs)
    reasons = {Job.objects.get(pk=j.pk).status_reason for j in jobs}
    assert reasons == {"waiting for a runner: all 2 local runners are busy (TRAINYARD_LOCAL_RUNNERS_MAX)"}


def test_a_runner_that_says_hello_idle_is_sent_the_oldest_pending_job_at_once(team: Workspace, owner: Person) -> None:
    """A runner that connects (a machine just up, a runner restarted) takes
    the oldest pending job it fits in its hello's turn: no pass runs here."""
    older = submit(team, owner.user, no_cache=True).jobs.get()
    submit(team, owner.user, no_cache=True)
    redis_client().delete(DIRTY_KEY, QUEUED_KEY, "celery")
    instance, ws = _connect_runner(team, "local-up")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_dump_json())
        welcome = json.loads(await ws.receive_from(timeout=5))
        assigned = json.loads(await ws.receive_from(timeout=5))
        await ws.disconnect()
        return welcome, assigned

    welcome, assigned = async_to_sync(scenario)()

    assert welcome["type"] == "welcome"
    assert (assigned["type"], assigned["job"], assigned["attempt"]) == ("assign_job", str(older.pk), 1)
    older.refresh_from_db()
    assert (older.status, older.instance_id) == (JobStatus.ASSIGNED, instance.pk)


async def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until ``check()`` holds, polling the event loop's way."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)

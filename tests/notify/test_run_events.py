"""The runs lifecycle tells subscriptions of a run's end and of an
attempt interrupted and resumed: one delivery each, recorded once the
change commits."""

from __future__ import annotations

from typing import Any

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.notify.models import EVENTS, Delivery, Subscription
from backend.runs.lifecycle.transitions import attempt_end, job_stop_by_server
from backend.runs.models import Run
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.attempts import accept, current_attempt, report
from tests.support.fixtures import Person


def _listening(team: Workspace, owner: Person) -> Subscription:
    return Subscription.objects.create(
        workspace=team, created_by=owner.user, kind="slack", target="https://1.1.1.1/hook", events=list(EVENTS)
    )


def _machine(team: Workspace) -> Instance:
    return Instance.objects.create(
        workspace=team, backend="local", name="local-test", token_hash="h" * 64, status=InstanceStatus.IDLE,
        cpus=2, memory_bytes=2**30, channel_name="test-channel",
    )  # fmt: skip


def test_a_run_that_succeeds_is_told_once(
    team: Workspace, owner: Person, run: Run, django_capture_on_commit_callbacks: Any
) -> None:
    _listening(team, owner)
    machine = _machine(team)
    with django_capture_on_commit_callbacks(execute=True):
        jobs_schedule()
        job = run.jobs.get()
        assert accept(job, machine.pk)
        assert report(job, machine.pk, "succeeded", 0)
        assert not report(job, machine.pk, "succeeded", 0)

    (delivery,) = Delivery.objects.all()
    assert delivery.event_type == "run.succeeded"
    assert delivery.payload["data"]["run"] == {"id": str(run.pk), "name": run.name, "status": "succeeded", "reason": ""}
    assert delivery.payload["workspace"] == "acme"


def test_an_interrupted_attempt_and_the_next_one_running_are_told(
    team: Workspace, owner: Person, run: Run, django_capture_on_commit_callbacks: Any
) -> None:
    _listening(team, owner)
    machine = _machine(team)
    with django_capture_on_commit_callbacks(execute=True):
        jobs_schedule()
        job = run.jobs.get()
        assert accept(job, machine.pk)
        assert attempt_end(attempt_id=str(current_attempt(job).pk), reason=TerminationReason.INTERRUPTED)
        Instance.objects.filter(pk=machine.pk).update(status=InstanceStatus.IDLE)
        jobs_schedule()
        assert accept(job, machine.pk)

    told = [(d.event_type, d.payload["data"]["attempt"]) for d in Delivery.objects.order_by("created_at")]
    attempt = {"job": job.name, "job_id": str(job.pk)}
    assert told == [
        ("attempt.interrupted", {**attempt, "number": 1, "retried": True}),
        ("attempt.resumed", {**attempt, "number": 2}),
    ]


def test_a_rolled_back_change_tells_no_one(team: Workspace, owner: Person, run: Run) -> None:
    _listening(team, owner)
    machine = _machine(team)
    jobs_schedule()
    job = run.jobs.get()
    assert accept(job, machine.pk)
    assert report(job, machine.pk, "failed", 1)  # the test's transaction never commits

    assert not Delivery.objects.exists()


def test_a_guard_that_stops_a_job_is_told_with_what_it_saw(
    team: Workspace, owner: Person, run: Run, django_capture_on_commit_callbacks: Any
) -> None:
    _listening(team, owner)
    machine = _machine(team)
    jobs_schedule()
    job = run.jobs.get()
    assert accept(job, machine.pk)
    job.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        assert job_stop_by_server(job=job, reason=TerminationReason.STALLED, message="no output for 20m")
        assert not job_stop_by_server(job=job, reason=TerminationReason.STALLED, message="no output for 21m")

    (delivery,) = Delivery.objects.all()
    assert delivery.event_type == "guard.fired"
    data = delivery.payload["data"]
    assert (data["guard"], data["message"], data["job"]["name"]) == ("stalled", "no output for 20m", job.name)

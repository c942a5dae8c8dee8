"""Fencing: the server listens only to a job's current attempt on its own
instance; a lost instance's runner is refused; a lost acceptance is
recorded on reconnect and never makes the job run twice."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceReason, InstanceStatus
from backend.clouds.services.instances import instance_mark_lost
from backend.runs.lifecycle.transitions import attempt_end
from backend.runs.models import Attempt, AttemptStatus, Job, JobStatus, LogChunk, Run
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.attempts import accept, current_attempt
from tests.support.fixtures import submit
from tests.support.runners import HELLO, runner_instance, runner_socket

pytestmark = pytest.mark.django_db(transaction=True)


def _runner(team: Workspace, name: str, token: str) -> Instance:
    return runner_instance(team, name, token, channel_name=f"chan-{name}")


def _connect(token: str) -> WebsocketCommunicator:
    return runner_socket(token)


def _moved_to_another_runner(team: Workspace, run: Run) -> tuple[Job, Instance, Instance]:
    """Attempt 1 on ``old`` ended (its machine was lost); attempt 2 runs on ``new``."""
    old = _runner(team, "old", "old-secret")
    jobs_schedule()
    job = run.jobs.get()
    accept(job, old.pk)
    attempt_end(attempt_id=str(current_attempt(job).pk), reason=TerminationReason.INSTANCE_LOST, message="test")
    Instance.objects.filter(pk=old.pk).update(status=InstanceStatus.IDLE)
    new = _runner(team, "new", "new-secret")
    Instance.objects.filter(pk=old.pk).update(status=InstanceStatus.BUSY)  # old is not offered the job again
    jobs_schedule()
    job.refresh_from_db()
    assert (job.attempt, job.instance_id) == (2, new.pk)
    accept(job, new.pk)
    Instance.objects.filter(pk=old.pk).update(status=InstanceStatus.IDLE)
    return job, old, new


def test_a_runner_back_with_a_moved_attempt_is_told_to_stop_and_its_frames_are_refused(
    team: Workspace, run: Run
) -> None:
    job, _old, _ = _moved_to_another_runner(team, run)
    held = protocol.HeldJob(job=str(job.pk), attempt=1, lease="old-lease", confirmed=True)

    async def scenario() -> list[dict[str, Any]]:
        ws = _connect("old-secret")
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_copy(update={"running_jobs": [held]}).model_dump_json())
        welcome = json.loads(await ws.receive_from(timeout=5))
        logs = protocol.Logs.of(job=str(job.pk), attempt=1, first_seq=1, lines=[(1.0, "o", "late line")])
        await ws.send_to(text_data=logs.model_dump_json())
        refused_logs = json.loads(await ws.receive_from(timeout=5))
        final = protocol.JobState(job=str(job.pk), attempt=1, state="succeeded", exit_code=0)
        await ws.send_to(text_data=final.model_dump_json())
        refused_state = json.loads(await ws.receive_from(timeout=5))
        await ws.disconnect()
        return [welcome, refused_logs, refused_state]

    welcome, refused_logs, refused_state = async_to_sync(scenario)()

    assert (welcome["refused"], welcome["cancel"], welcome["confirmed"]) == ([str(job.pk)], [], [])
    for refused in (refused_logs, refused_state):
        assert (refused["type"], refused["job"], refused["attempt"]) == ("refused", str(job.pk), 1)
        assert "not the job's current one" in refused["reason"]
    job.refresh_from_db()
    assert (job.status, job.attempt, job.last_seq) == (JobStatus.RUNNING, 2, 0)
    assert not LogChunk.objects.filter(job_id=job.pk).exists()


def test_a_second_hello_never_revives_a_lost_instance(team: Workspace) -> None:
    """The connection is authenticated while the instance lives; another
    process declares it lost before the hello arrives: the hello is refused."""
    instance = _runner(team, "gone", "gone-secret")

    async def scenario() -> Any:
        ws = _connect("gone-secret")
        await ws.connect()
        await database_sync_to_async(_mark_lost)(str(instance.pk))
        await ws.send_to(text_data=HELLO.model_dump_json())
        closed = await ws.receive_output(timeout=5)
        await ws.wait()
        return closed

    closed = async_to_sync(scenario)()

    assert (closed["type"], closed["code"]) == ("websocket.close", protocol.CLOSE_FENCED)
    instance.refresh_from_db()
    assert (instance.status, instance.channel_name) == (InstanceStatus.LOST, "")


def _mark_lost(instance_id: str) -> None:
    assert instance_mark_lost(instance_id=instance_id, reason=InstanceReason.MACHINE_GONE, message="test")


def test_an_acceptance_that_was_lost_is_recorded_at_the_reconnect_and_confirmed_once(
    team: Workspace, run: Run, tmp_path: Any, settings: Any
) -> None:
    instance = _runner(team, "r1", "r1-secret")
    drop = tmp_path / "drop"
    drop.write_text("drop one\n")
    settings.TRAINYARD = {**settings.TRAINYARD, "TEST_DROP_ACCEPTANCES": str(drop)}

    async def scenario() -> tuple[dict[str, Any], list[str], dict[str, Any]]:
        ws = _connect("r1-secret")
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_dump_json())
        await ws.receive_from(timeout=5)  # welcome
        await database_sync_to_async(jobs_schedule)()
        assigned = json.loads(await ws.receive_from(timeout=5))
        accepted = protocol.JobAccepted(job=assigned["job"], attempt=assigned["attempt"], lease=assigned["lease"])
        await ws.send_to(text_data=accepted.model_dump_json())  # dropped by the hook: no answer
        silence = [] if await ws.receive_nothing(timeout=1) else ["answered"]
        await ws.disconnect()
        held = protocol.HeldJob(job=assigned["job"], attempt=1, lease=assigned["lease"], confirmed=False)
        ws = _connect("r1-secret")
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_copy(update={"running_jobs": [held]}).model_dump_json())
        welcome = json.loads(await ws.receive_from(timeout=5))
        await ws.disconnect()
        return assigned, silence, welcome

    assigned, silence, welcome = async_to_sync(scenario)()

    job = run.jobs.get()
    assert (assigned["type"], assigned["job"], assigned["attempt"], assigned["seq_base"]) == (
        "assign_job",
        str(job.pk),
        1,
        0,
    )
    assert silence == []
    assert welcome["confirmed"] == [str(job.pk)] and welcome["cancel"] == [], welcome
    attempt = current_attempt(job)
    assert (attempt.status, job.status, job.instance_id) == (AttemptStatus.RUNNING, JobStatus.RUNNING, instance.pk)
    assert Attempt.objects.filter(job=job).count() == 1


def test_a_runner_of_another_protocol_version_is_told_what_to_upgrade(team: Workspace) -> None:
    _runner(team, "old-runner", "old-runner-secret")

    async def scenario() -> Any:
        ws = _connect("old-runner-secret")
        await ws.connect()
        v1 = {**HELLO.model_dump(), "protocol": 1, "running_jobs": ["a-job-it-still-runs"]}  # v1: job ids
        await ws.send_to(text_data=json.dumps(v1))
        closed = await ws.receive_output(timeout=5)
        await ws.wait()
        return closed

    closed = async_to_sync(scenario)()

    assert (closed["code"], closed["reason"]) == (
        protocol.CLOSE_VERSION_MISMATCH,
        f"runner speaks protocol 1, server {protocol.PROTOCOL_VERSION}: upgrade trainyard-runner",
    )


def test_welcome_acks_only_the_jobs_that_runner_holds_never_another_workspaces(
    team: Workspace, run: Run, outsider: Any
) -> None:
    """A hello naming jobs it does not hold (another workspace's, or one moved
    to another runner) learns nothing of them: ``acked`` names only the jobs
    whose current attempt runs on this runner."""
    job, _old, _new = _moved_to_another_runner(team, run)
    Job.objects.filter(pk=job.pk).update(last_seq=17)
    elsewhere = Workspace.objects.create(slug="rival", name="Rival")
    theirs = submit(elsewhere, outsider.user).jobs.get()
    Job.objects.filter(pk=theirs.pk).update(last_seq=42)
    named = [
        protocol.HeldJob(job=str(theirs.pk), attempt=1, lease="x", confirmed=True),
        protocol.HeldJob(job=str(job.pk), attempt=1, lease="old-lease", confirmed=True),
        protocol.HeldJob(job="not-a-uuid", attempt=1, lease="x", confirmed=True),
    ]

    async def scenario() -> dict[str, Any]:
        ws = _connect("old-secret")
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_copy(update={"running_jobs": named}).model_dump_json())
        welcome = json.loads(await ws.receive_from(timeout=5))
        await ws.disconnect()
        return welcome

    welcome = async_to_sync(scenario)()

    assert welcome["type"] == "welcome"
    assert welcome["acked"] == {}
    assert sorted(welcome["refused"]) == sorted([str(theirs.pk), str(job.pk), "not-a-uuid"])


def test_welcome_acks_the_stored_seq_of_a_job_the_runner_holds(team: Workspace, run: Run) -> None:
    job, _old, _new = _moved_to_another_runner(team, run)
    Job.objects.filter(pk=job.pk).update(last_seq=17)
    held = protocol.HeldJob(job=str(job.pk), attempt=2, lease=current_attempt(job).lease, confirmed=True)

    async def scenario() -> dict[str, Any]:
        ws = _connect("new-secret")
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_copy(update={"running_jobs": [held]}).model_dump_json())
        welcome = json.loads(await ws.receive_from(timeout=5))
        await ws.disconnect()
        return welcome

    welcome = async_to_sync(scenario)()

    assert (welcome["acked"], welcome["confirmed"]) == ({str(job.pk): 17}, [str(job.pk)])

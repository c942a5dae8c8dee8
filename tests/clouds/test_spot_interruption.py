"""A runner's spot interruption report, in process (fake backend, real
Postgres, the real runner consumer over a WebsocketCommunicator): the attempt
ends ``interrupted`` at once and the job is retried; the machine takes no
new work and is terminated only from the cloud's deadline on; the next
machine is launched outside the interrupted zone (and an idle machine there
is not taken); the old runner's later frames are refused and not stored."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.artifacts.models import Artifact
from backend.artifacts.storage import get_storage
from backend.clouds.models import Instance, InstanceReason, InstanceStatus
from backend.clouds.services.instances import instance_disconnected
from backend.clouds.services.provisioning import instance_terminate_run
from backend.clouds.services.reconcile import _terminations_unconfirmed
from backend.config.asgi import application
from backend.core.tokens import hash_token
from backend.runs.lifecycle.transitions import attempts_wind_down_expire, job_report_final
from backend.runs.models import Attempt, JobStatus, LogChunk
from backend.runs.scheduler.claim import claim_instance
from backend.runs.scheduler.passes import jobs_schedule
from tests.clouds.test_placement import _hello, _running, _schedule, offer, workflow
from tests.support.attempts import assign_frame, current_attempt, job_credential, report
from tests.support.fixtures import Person, submit

pytestmark = pytest.mark.django_db(transaction=True)

HELLO = protocol.Hello(
    version="test", hostname="box", resources=protocol.Resources(cpus=2, memory_bytes=4 * 2**30, disk_bytes=2**35)
)
NOTICE = "spot interruption notice: the cloud will terminate this machine at 2026-12-01T12:00:00Z"


def _connect(token: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, "/ws/runner/", headers=[(b"authorization", f"Bearer {token}".encode())])


def test_an_interrupted_report_moves_the_job_out_of_the_zone_and_fences_the_old_runner(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1, zone="r1a", spot=True), offer("b", 0.2, zone="r1b", spot=True)])
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="spot")).jobs.get()
    first = _schedule(passes=1)
    assert first is not None and first.zone == "r1a"
    Instance.objects.filter(pk=first.pk).update(token_hash=hash_token("old-secret"))
    job = _running(job, first)
    attempt = current_attempt(job)
    reclaim_at = time.time() + 90
    held = protocol.HeldJob(job=str(job.pk), attempt=1, lease=attempt.lease, confirmed=True)
    instance_disconnected(instance_id=str(first.pk), channel_name="c")  # the connection _running played is gone

    async def scenario() -> list[dict[str, Any]]:
        ws = _connect("old-secret")
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_copy(update={"running_jobs": [held]}).model_dump_json())
        welcome = json.loads(await ws.receive_from(timeout=5))
        assert welcome["confirmed"] == [str(job.pk)]
        report = protocol.JobState(
            job=str(job.pk), attempt=1, state="interrupted", reason=NOTICE, interrupt_at=reclaim_at
        )
        await ws.send_to(text_data=report.model_dump_json())
        assert await ws.receive_nothing(timeout=1.0), "a current attempt's report is not refused"
        # The old runner winds down: its next lines and its final state come too late.
        late = protocol.Logs.of(job=str(job.pk), attempt=1, first_seq=1, lines=[(1.0, "o", "checkpoint saved")])
        await ws.send_to(text_data=late.model_dump_json())
        final = report.model_copy(update={"exit_code": 137})
        await ws.send_to(text_data=final.model_dump_json())
        answers = [json.loads(await ws.receive_from(timeout=5)) for _ in range(2)]
        await ws.disconnect()
        return answers

    answers = async_to_sync(scenario)()

    assert [(a["type"], a["attempt"]) for a in answers] == [("refused", 1), ("refused", 1)]
    assert not LogChunk.objects.filter(job=job).exists(), "nothing the old attempt sends after its report is stored"
    ended = Attempt.objects.get(job=job, number=1)
    assert (ended.status, ended.termination_reason) == ("ended", "interrupted")
    assert ended.termination_message == NOTICE
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING, "interruptions are retried by default"
    assert job.status_reason.startswith("retrying") or "interrupted" in job.status_reason

    # The machine takes no new work; it is terminated from the cloud's deadline on, not before.
    first.refresh_from_db()
    assert (first.status, first.termination_reason) == (InstanceStatus.TERMINATING, InstanceReason.INTERRUPTED)
    assert first.status_reason == NOTICE
    assert first.terminate_requested_at is not None
    deadline = datetime.fromtimestamp(reclaim_at, UTC)
    assert abs((first.terminate_requested_at + timedelta(seconds=30) - deadline).total_seconds()) < 1
    asked = first.terminate_requested_at
    _terminations_unconfirmed(timezone.now())
    first.refresh_from_db()
    assert first.terminate_requested_at == asked, "no terminate before the deadline: the runner still syncs"
    _terminations_unconfirmed(deadline + timedelta(seconds=1))
    first.refresh_from_db()
    assert first.terminate_requested_at == deadline + timedelta(seconds=1), "asked at the deadline"

    # The replacement is launched at once, outside the interrupted zone (r1a is cheaper).
    second = _schedule(passes=1)
    assert second is not None and second.zone == "r1b"
    assert Attempt.objects.filter(job=job).count() == 1  # attempt 2 is made when a runner takes it
    _hello(second)
    job = _running(job, second)
    assert (job.attempt, job.instance_id) == (2, second.pk)
    instance_terminate_run(instance_id=str(first.pk))


def test_an_idle_machine_in_the_interrupted_zone_is_not_taken_for_3_minutes(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1, zone="r1a", spot=True)])
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="spot")).jobs.get()
    first = _schedule(passes=1)
    assert first is not None
    job = _running(job, first)
    other = _schedule_idle_twin(first)
    assert report(job, first.pk, "interrupted", reason=NOTICE)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert _claim(job) is None, "the idle machine in r1a is skipped"
    Attempt.objects.filter(job=job, number=1).update(finished_at=timezone.now() - timedelta(seconds=181))
    assert _claim(job) == other, "3 minutes on, it is taken again"
    instance_terminate_run(instance_id=str(first.pk))


def _claim(job: Any) -> Instance | None:
    with transaction.atomic():
        return claim_instance(job)


def _schedule_idle_twin(instance: Instance) -> Instance:
    """Another connected, idle machine in the same zone."""
    twin = Instance.objects.get(pk=instance.pk)
    twin.pk = None
    twin.name = f"{instance.name}-twin"
    twin.token_hash = hash_token("twin")
    twin.idempotency_key = f"{instance.idempotency_key}-twin"
    twin.backend_id = ""
    twin.requested_for = None
    twin.save()
    Instance.objects.filter(pk=twin.pk).update(status=InstanceStatus.IDLE, idle_since=timezone.now(), channel_name="t")
    return Instance.objects.get(pk=twin.pk)


# ------------------------------------------------- the sync made at the notice


def _runner_api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _sync_as_runner(client: APIClient, job: Any, attempt: int, data: bytes) -> Any:
    """One checkpoint version the way the runner makes it: begin, the file
    into the storage, complete; returns the complete's answer."""
    manifest = [{"path": "state.json", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    begun = client.post(
        f"/api/v1/runner/jobs/{job.pk}/checkpoints/?attempt={attempt}",
        {"path": "./ckpt", "files": manifest},
        format="json",
    )
    if begun.status_code != 201:
        return begun
    version = Artifact.stored.get(pk=begun.json()["id"])
    get_storage().write(f"{version.storage_prefix}/state.json", iter([data]))
    return client.post(f"/api/v1/runner/jobs/{job.pk}/artifacts/{version.pk}/complete/?attempt={attempt}")


def _interrupted_with_a_checkpoint(fake_account: Any, team: Workspace, owner: Person) -> tuple[Any, Instance]:
    fake_account([offer("a", 0.1, zone="r1a", spot=True), offer("b", 0.2, zone="r1b", spot=True)])
    text = workflow(spot_policy="spot", checkpoint="./ckpt")
    job = submit(team, owner.user, workflow="train", text=text).jobs.get()
    first = _schedule(passes=1)
    assert first is not None
    Instance.objects.filter(pk=first.pk).update(token_hash=hash_token("old-secret"))
    job = _running(job, first)
    assert _sync_as_runner(_runner_api(job_credential("old-secret", job, 1)), job, 1, b'{"step": 4}').status_code == 200
    assert job_report_final(
        job_id=str(job.pk),
        instance_id=str(first.pk),
        attempt=1,
        state="interrupted",
        exit_code=None,
        reason=NOTICE,
        interrupt_at=time.time() + 90,
    )
    return job, first


def test_the_sync_made_at_the_notice_is_taken_and_the_next_attempt_restores_it(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    job, first = _interrupted_with_a_checkpoint(fake_account, team, owner)
    old = _runner_api(job_credential("old-secret", job, 1))

    # The replacement is launched at once and comes up, but the job waits for the old runner's last sync.
    second = _schedule(passes=1)
    assert second is not None and second.zone == "r1b"
    _hello(second)
    jobs_schedule()
    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.PENDING, 1)
    assert job.status_reason.startswith("waiting for attempt 1's last checkpoint sync"), job.status_reason
    assert f"{second.name} is ready for it" in job.status_reason
    assert Instance.objects.filter(account=first.account).count() == 2, "nothing more is launched while it waits"

    # The interrupted attempt may sync its checkpoint, and nothing else.
    done = _sync_as_runner(old, job, 1, b'{"step": 10}')
    assert done.status_code == 200, done.content
    assert (done.json()["number"], done.json()["latest"]) == (2, True)
    artifact = old.post(
        f"/api/v1/runner/jobs/{job.pk}/artifacts/?attempt=1", {"path": "model", "files": []}, format="json"
    )
    assert artifact.status_code == 404, "an interrupted attempt uploads no artifacts"
    stranger = _sync_as_runner(_runner_api("twin"), job, 1, b"{}")
    assert stranger.status_code == 401

    # Its runner says it is done: attempt 2 goes to the machine that waited, with checkpoint 2.
    assert old.post(f"/api/v1/runner/jobs/{job.pk}/checkpoints/done/?attempt=1").status_code == 204
    jobs_schedule()
    job.refresh_from_db()
    assert (job.status, job.attempt, job.instance_id) == (JobStatus.ASSIGNED, 2, second.pk)
    frame = assign_frame(job)
    assert frame.checkpoint is not None and frame.checkpoint.version == 2
    late = _sync_as_runner(old, job, 1, b'{"step": 11}')
    assert late.status_code == 404, "after it said done, the old attempt syncs no more"
    instance_terminate_run(instance_id=str(first.pk))


def test_without_the_runners_word_the_next_attempt_waits_only_until_the_deadline(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    job, first = _interrupted_with_a_checkpoint(fake_account, team, owner)
    second = _schedule(passes=1)
    assert second is not None
    _hello(second)
    jobs_schedule()
    job.refresh_from_db()
    assert job.attempt == 1, "held"

    Attempt.objects.filter(job=job, number=1).update(wind_down_until=timezone.now() - timedelta(seconds=1))
    assert attempts_wind_down_expire() == 1
    jobs_schedule()
    job.refresh_from_db()
    assert (job.attempt, job.instance_id) == (2, second.pk)
    assert _sync_as_runner(_runner_api("old-secret"), job, 1, b"{}").status_code == 404, "past the deadline: refused"
    instance_terminate_run(instance_id=str(first.pk))


def test_an_interrupted_job_without_a_checkpoint_is_not_held(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1, zone="r1a", spot=True), offer("b", 0.2, zone="r1b", spot=True)])
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="spot")).jobs.get()
    first = _schedule(passes=1)
    assert first is not None
    job = _running(job, first)
    assert report(job, first.pk, "interrupted", reason=NOTICE)
    assert Attempt.objects.get(job=job, number=1).wind_down_until is None
    second = _schedule(passes=1)
    assert second is not None
    job = _running(job, second)
    assert job.attempt == 2
    instance_terminate_run(instance_id=str(first.pk))


def test_each_interruption_keeps_the_job_out_of_its_zone_for_3_minutes(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    """r1a is cheaper than r1b. Interrupted in r1a → r1b; interrupted in r1b
    too → nothing is launched while both zones are fresh; r1a's 3 minutes
    over → r1a again; interrupted in r1a a second time → r1b (once its own 3
    minutes are over), never r1a within 3 minutes of its last interruption."""
    fake_account([offer("a", 0.1, zone="r1a", spot=True), offer("b", 0.2, zone="r1b", spot=True)])
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="spot")).jobs.get()
    machines = []

    def interrupt_and_next(passes: int = 1) -> Instance | None:
        current = machines[-1]
        nonlocal job
        job = _running(job, current)
        assert report(job, current.pk, "interrupted", reason=NOTICE)
        instance_terminate_run(instance_id=str(current.pk))
        launched = _schedule(passes=passes)
        if launched is not None:
            machines.append(launched)
        return launched

    def age(number: int) -> None:
        Attempt.objects.filter(job=job, number=number).update(finished_at=timezone.now() - timedelta(seconds=181))

    first = _schedule(passes=1)
    assert first is not None and first.zone == "r1a"
    machines.append(first)
    second = interrupt_and_next()
    assert second is not None and second.zone == "r1b"
    assert interrupt_and_next(passes=2) is None, "both zones were interrupted less than 3 minutes ago"
    job.refresh_from_db()
    assert "zone r1a skipped" in job.status_reason and "zone r1b skipped" in job.status_reason, job.status_reason

    age(1)
    third = _schedule(passes=1)
    assert third is not None and third.zone == "r1a", "r1a's 3 minutes are over"
    machines.append(third)
    assert interrupt_and_next(passes=2) is None, "the second interruption in r1a keeps it out again; r1b is fresh too"
    age(2)
    fourth = _schedule(passes=1)
    assert fourth is not None and fourth.zone == "r1b", "r1b's 3 minutes are over, r1a's second ones are not"
    machines.append(fourth)
    job = _running(job, fourth)
    assert job.attempt == 4

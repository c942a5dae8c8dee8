"""A runner's spot interruption report, in process (fake backend, real
Postgres, the real runner consumer over a WebsocketCommunicator): the attempt
ends ``interrupted`` at once and the job is retried; the machine takes no
new work and is terminated only from the cloud's deadline on; the next
machine is launched outside the interrupted zone (and an idle machine there
is not taken); the old runner's later frames are refused and not stored."""

from __future__ import annotations

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
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceReason, InstanceStatus
from backend.clouds.services.provisioning import instance_terminate_run
from backend.clouds.services.reconcile import _terminations_unconfirmed
from backend.config.asgi import application
from backend.core.tokens import hash_token
from backend.runs.models import Attempt, JobStatus, LogLine
from backend.runs.services.scheduling import _claim_instance
from tests.clouds.test_placement import _hello, _running, _schedule, offer, workflow
from tests.support.attempts import current_attempt, report
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
        late = protocol.Logs(job=str(job.pk), attempt=1, first_seq=1, lines=[(1.0, "o", "checkpoint saved")])
        await ws.send_to(text_data=late.model_dump_json())
        final = report.model_copy(update={"exit_code": 137})
        await ws.send_to(text_data=final.model_dump_json())
        answers = [json.loads(await ws.receive_from(timeout=5)) for _ in range(2)]
        await ws.disconnect()
        return answers

    answers = async_to_sync(scenario)()

    assert [(a["type"], a["attempt"]) for a in answers] == [("refused", 1), ("refused", 1)]
    assert not LogLine.objects.filter(job=job).exists(), "nothing the old attempt sends after its report is stored"
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
        return _claim_instance(job)


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

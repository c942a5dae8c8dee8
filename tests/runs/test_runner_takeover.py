"""A runner's token opens one live connection: a second connection with it
does not displace the first while the first is heartbeating (a stolen token
takes over nothing); once the first has been silent past the liveness
window, the new one takes over (a runner back from a network blip).
Real websocket consumer, channel layer (Redis) and database."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.utils import timezone
from trainyard_runner import protocol

from backend.accounts.models import AuditEvent, Workspace
from backend.accounts.services import hash_token
from backend.clouds.models import Instance, InstanceStatus
from backend.config.asgi import application
from backend.runs.models import AttemptStatus, JobStatus, Run
from tests.support.attempts import accept, current_attempt

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "runner-secret"
HELLO = protocol.Hello(
    version="test", hostname="box", resources=protocol.Resources(cpus=2, memory_bytes=2**31, disk_bytes=2**33)
)


def _runner(team: Workspace) -> Instance:
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name="local-x",
        token_hash=hash_token(TOKEN),
        status=InstanceStatus.PROVISIONING,
    )


def _connect() -> WebsocketCommunicator:
    return WebsocketCommunicator(application, "/ws/runner/", headers=[(b"authorization", f"Bearer {TOKEN}".encode())])


async def _say_hello(ws: WebsocketCommunicator, hello: protocol.Hello = HELLO) -> dict[str, Any]:
    await ws.connect()
    await ws.send_to(text_data=hello.model_dump_json())
    return dict(await ws.receive_output(timeout=5))


def test_a_second_connection_with_a_live_runners_token_is_refused_and_the_first_keeps_its_job(
    team: Workspace, run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    instance = _runner(team)
    job = run.jobs.get()
    caplog.set_level(logging.WARNING, logger="trainyard.security")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        first = _connect()
        await _say_hello(first)
        assigned = json.loads(await first.receive_from(timeout=5))
        assert assigned["job"] == str(job.pk)
        assert await database_sync_to_async(accept)(job, instance.pk)
        lease = (await database_sync_to_async(current_attempt)(job)).lease
        held = protocol.HeldJob(job=str(job.pk), attempt=1, lease=lease, confirmed=True)
        await first.send_to(text_data=protocol.Heartbeat(state="busy").model_dump_json())
        thief = _connect()
        # The thief claims the job too: it must get nothing of it.
        refused = await _say_hello(thief, HELLO.model_copy(update={"running_jobs": [held]}))
        if refused["type"] != "websocket.close":
            return refused, {}
        await thief.wait()
        await first.send_to(text_data=protocol.Heartbeat(state="busy").model_dump_json())
        batch = protocol.Logs.of(job=str(job.pk), attempt=1, first_seq=1, lines=[(1.0, "o", "still mine")])
        await first.send_to(text_data=batch.model_dump_json())
        ack = json.loads(await first.receive_from(timeout=5))
        await first.disconnect()
        return refused, ack

    refused, ack = async_to_sync(scenario)()

    assert refused["type"] == "websocket.close" and refused["code"] == protocol.CLOSE_IN_USE == 4412
    window = settings.TRAINYARD["HEARTBEAT_TIMEOUT_SECONDS"]
    assert refused["reason"] == (
        f"runner {instance.name} is connected and heartbeating elsewhere; retry after {window:.0f}s of its silence"
    )
    assert ack == {"type": "log_ack", "job": str(job.pk), "seq": 1}, "the first connection still holds the job"
    job.refresh_from_db()
    instance.refresh_from_db()
    assert (job.status, job.instance_id, job.attempt) == (JobStatus.RUNNING, instance.pk, 1)
    assert current_attempt(job).status == AttemptStatus.RUNNING
    assert instance.status == InstanceStatus.BUSY
    events = [r for r in caplog.records if r.name == "trainyard.security"]
    assert [r.getMessage() for r in events] == [
        f"security event runner_connection_refused: instance {instance.pk} ({instance.name}), workspace {team.pk}: "
        "another connection with its token is live (its last heartbeat 0s ago)"
    ]
    # and in the workspace's audit log, for its admins
    audited = list(AuditEvent.objects.for_workspace(team).values_list("action", "runner", "target"))
    assert audited == [("runner.connection_refused", instance.name, instance.name)]


def test_a_connection_whose_previous_holder_went_silent_takes_over(team: Workspace, run: Run) -> None:
    instance = _runner(team)
    window = settings.TRAINYARD["HEARTBEAT_TIMEOUT_SECONDS"]

    def silent() -> None:
        # The old connection is still open on the server but silent past the
        # window (a network blip: the runner is back on a new connection).
        Instance.objects.filter(pk=instance.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=window + 1))

    async def back_after_a_blip() -> tuple[dict[str, Any], dict[str, Any]]:
        old = _connect()
        await _say_hello(old)
        await database_sync_to_async(silent)()
        new = _connect()
        welcome = await _say_hello(new)
        replaced = await old.receive_output(timeout=5)
        while replaced["type"] != "websocket.close":  # what the hello handed the old connection
            replaced = await old.receive_output(timeout=5)
        await new.disconnect()
        return welcome, replaced

    welcome, replaced = async_to_sync(back_after_a_blip)()

    assert json.loads(welcome["text"])["type"] == "welcome"
    assert replaced["type"] == "websocket.close" and replaced["code"] == protocol.CLOSE_REPLACED

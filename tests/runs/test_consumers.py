"""The websocket consumers, driven with Channels' WebsocketCommunicator
against the real channel layer (Redis) and database."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.accounts.services import hash_token
from backend.clouds.models import Instance, InstanceStatus
from backend.config.asgi import application
from backend.runs.events import run_group
from backend.runs.models import JobStatus, Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.selectors import job_log_lines
from backend.runs.services.logs import logs_store
from tests.support.attempts import accept, current_attempt
from tests.support.fixtures import Person
from tests.support.frames import frame_lines, logs_frame

# database_sync_to_async closes connections between calls, which would end
# a test's wrapping transaction: these tests commit for real.
pytestmark = pytest.mark.django_db(transaction=True)

HELLO = protocol.Hello(
    version="test", hostname="box", resources=protocol.Resources(cpus=2, memory_bytes=2**31, disk_bytes=2**33)
)


def _runner(team: Workspace, token: str = "runner-secret") -> Instance:
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name="local-x",
        token_hash=hash_token(token),
        status=InstanceStatus.PROVISIONING,
    )


def _connect(path: str, token: str | None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return WebsocketCommunicator(application, path, headers=headers)


def test_a_runner_with_a_wrong_token_is_closed_4401(team: Workspace) -> None:
    _runner(team)

    async def scenario() -> Any:
        ws = _connect("/ws/runner/", "wrong")
        await ws.connect()
        closed = await ws.receive_output(timeout=5)
        await ws.wait()
        return closed

    assert async_to_sync(scenario)() == {"type": "websocket.close", "code": 4401}


def test_hello_registers_the_runner_which_takes_the_pending_job_and_logs_are_acknowledged(
    team: Workspace, run: Run
) -> None:
    instance = _runner(team)

    async def hello() -> list[dict[str, Any]]:
        ws = _connect("/ws/runner/", "runner-secret")
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_dump_json())
        welcome = json.loads(await ws.receive_from(timeout=5))
        assigned = json.loads(await ws.receive_from(timeout=5))  # the hello's hand-over: the pending job
        await ws.disconnect()
        return [welcome, assigned]

    welcome, assigned = async_to_sync(hello)()
    instance.refresh_from_db()
    job = run.jobs.get()
    assert welcome["type"] == "welcome" and welcome["instance"] == str(instance.pk)
    assert (instance.cpus, instance.hostname) == (2, "box")
    assert (assigned["type"], assigned["job"]) == ("assign_job", str(job.pk))
    assert (instance.status, job.status, job.instance_id) == (InstanceStatus.BUSY, JobStatus.ASSIGNED, instance.pk)

    accept(job, instance.pk)

    held = protocol.HeldJob(job=str(job.pk), attempt=1, lease=current_attempt(job).lease, confirmed=True)

    async def logs() -> list[dict[str, Any]]:
        ws = _connect("/ws/runner/", "runner-secret")
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_copy(update={"running_jobs": [held]}).model_dump_json())
        welcome = json.loads(await ws.receive_from(timeout=5))
        batch = protocol.Logs.of(job=str(job.pk), attempt=1, first_seq=1, lines=[(1.0, "o", "a"), (2.0, "e", "b")])
        await ws.send_to(text_data=batch.model_dump_json())
        ack = json.loads(await ws.receive_from(timeout=5))
        await ws.send_to(text_data=batch.model_dump_json())  # a resend after a lost ack
        ack_again = json.loads(await ws.receive_from(timeout=5))
        await ws.disconnect()
        return [welcome, ack, ack_again]

    welcome, ack, ack_again = async_to_sync(logs)()
    assert welcome["acked"] == {str(job.pk): 0}
    assert ack == ack_again == {"type": "log_ack", "job": str(job.pk), "seq": 2}
    assert [(seq, stream, text) for seq, _, stream, text in job_log_lines(job_id=str(job.pk))] == [
        (1, "o", "a"),
        (2, "e", "b"),
    ]


def test_a_follower_needs_credentials_and_membership(run: Run, outsider: Person) -> None:
    path = f"/ws/v1/workspaces/acme/runs/{run.name}/"

    async def close_code(token: str | None) -> int:
        ws = _connect(path, token)
        await ws.connect()
        message = await ws.receive_output(timeout=5)
        await ws.wait()
        return message["code"]

    assert async_to_sync(close_code)(None) == 4401
    assert async_to_sync(close_code)(outsider.token) == 4404


def test_a_follower_gets_the_backlog_then_live_lines_once(team: Workspace, run: Run, member: Person) -> None:
    instance = _runner(team)
    Instance.objects.filter(pk=instance.pk).update(status=InstanceStatus.IDLE, channel_name="x")
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)
    logs_store(
        job_id=str(job.pk),
        instance_id=str(instance.pk),
        attempt=1,
        first_seq=1,
        lines=[(1.0, "o", "one"), (2.0, "o", "two")],
    )

    async def follow() -> list[dict[str, Any]]:
        ws = _connect(f"/ws/v1/workspaces/acme/runs/{run.name}/?after_seq=1", member.token)
        await ws.connect()
        frames = [json.loads(await ws.receive_from(timeout=5)) for _ in range(2)]
        # Seq 2 again (published while the backlog was read), then seq 3.
        await _publish(run, job, [[2, 2.0, "o", "two"], [3, 3.0, "o", "three"]])
        frames.append(json.loads(await ws.receive_from(timeout=5)))
        # 4 and 5 stored but their event lost; 6 arrives: the gap is filled from storage.
        await database_sync_to_async(logs_store)(
            job_id=str(job.pk),
            instance_id=str(instance.pk),
            attempt=1,
            first_seq=3,
            lines=[(3.0, "o", "three"), (4.0, "o", "four"), (5.0, "e", "five"), (6.0, "o", "six")],
        )
        await _publish(run, job, [[6, 6.0, "o", "six"]])
        frames += [json.loads(await ws.receive_from(timeout=5)) for _ in range(2)]
        await ws.disconnect()
        return frames

    snapshot, backlog, live, filled, six = async_to_sync(follow)()
    assert snapshot["type"] == "run" and snapshot["run"]["name"] == run.name
    assert frame_lines(backlog) == [[2, 2.0, "o", "two"]]
    assert frame_lines(live) == [[3, 3.0, "o", "three"]]
    assert frame_lines(filled) == [[4, 4.0, "o", "four"], [5, 5.0, "e", "five"]]
    assert six == logs_frame(str(job.pk), [[6, 6.0, "o", "six"]])


def test_job_after_starts_a_jobs_backlog_where_the_dashboard_holds_it(
    team: Workspace, run: Run, member: Person
) -> None:
    """The run page reads older lines through the pages: the socket sends
    only the lines after job_after's seq for that job (after_seq for others),
    and ignores a malformed value."""
    instance = _runner(team)
    Instance.objects.filter(pk=instance.pk).update(status=InstanceStatus.IDLE, channel_name="x")
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)
    lines = [(float(i), "o", f"line {i}") for i in range(1, 6)]
    logs_store(job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=1, lines=lines)

    async def backlog(query: str) -> list[int]:
        ws = _connect(f"/ws/v1/workspaces/acme/runs/{run.name}/?{query}", member.token)
        await ws.connect()
        frames = [json.loads(await ws.receive_from(timeout=5)) for _ in range(2)]
        await ws.disconnect()
        return [line[0] for line in frame_lines(frames[1])]

    assert async_to_sync(backlog)(f"after_seq=0&job_after={job.pk}:3") == [4, 5]
    assert async_to_sync(backlog)(f"after_seq=1&job_after={job.pk}:x&job_after=nonsense") == [2, 3, 4, 5]


async def _publish(run: Run, job: Any, lines: list[list[Any]]) -> None:
    """What the runner consumer publishes after storing a batch."""
    frame = json.dumps(logs_frame(str(job.pk), lines))
    event = {"type": "run.logs", "job": str(job.pk), "first_seq": lines[0][0], "last_seq": lines[-1][0], "frame": frame}
    await get_channel_layer().group_send(run_group(run.pk), event)


def test_the_opening_of_a_follower_reads_no_log_of_a_job_with_nothing_stored_after_its_start(
    team: Workspace, run: Run
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from backend.runs.consumers.follow import _opening

    instance = _runner(team)
    Instance.objects.filter(pk=instance.pk).update(status=InstanceStatus.IDLE, channel_name="x")
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)

    def opening(after_seq: int) -> tuple[list[Any], list[str]]:
        with CaptureQueriesContext(connection) as queries:
            found = _opening(team, str(run.pk), after_seq, {})
        assert found is not None
        return found[1][str(job.pk)][0], [q["sql"] for q in queries if "runs_logchunk" in q["sql"]]

    assert opening(0) == ([], [])  # just submitted: nothing stored
    lines = [(float(i), "o", f"line {i}") for i in range(1, 4)]
    logs_store(job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=1, lines=lines)
    page, reads = opening(1)
    assert [(seq, text) for seq, _, _, text in page] == [(2, "line 2"), (3, "line 3")]
    assert reads  # read from storage
    assert opening(3) == ([], [])  # all of it before the start


def test_a_burst_of_follower_connects_reads_at_most_two_at_once_and_each_gets_its_answer() -> None:
    """The connects' thread reads (admission, opening) go through a gate:
    at a burst they take turns, so the loop that sends the frames of those
    already following keeps the interpreter (decision 0065)."""
    import asyncio
    import threading
    import time

    from backend.runs.consumers.follow import CONNECT_READS_AT_ONCE, connect_read

    running, most = 0, 0
    lock = threading.Lock()

    def read(i: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return i

    async def burst() -> list[int]:
        return await asyncio.gather(*(connect_read(read, i) for i in range(12)))

    assert async_to_sync(burst)() == list(range(12))
    assert most == CONNECT_READS_AT_ONCE == 2

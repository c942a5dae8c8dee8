"""One runner frame cannot stall a web process (docs/decisions/0081-linear-redaction.md).

A runner's reason is cut at the protocol (``MAX_REASON_CHARS``), read only
from the runner that holds the job, and redacted in linear time: a frame with
a 1 MiB reason made of the inputs that made the redaction patterns backtrack
is answered, and the frames after it on its own socket and on another
runner's are answered within 200 ms, through the real ASGI application and
runner consumer.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import Instance
from backend.runs.models import Job, Run
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.attempts import accept, current_attempt
from tests.support.runners import HELLO, runner_instance, runner_socket

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1 << 20
BOUND = 0.200  # seconds from the adversarial frame to the answer of the frame after it
# Half a run of scheme characters with a word boundary at every other one,
# half a run of "http://" without a query: each made a redaction pattern
# retry at every step, reading the rest of the run each time.
ADVERSARIAL = "a." * (MIB // 4) + "http://" * (MIB // 2 // 7)


def _holding(team: Workspace, run: Run) -> tuple[Job, Instance]:
    """The run's job, running on a runner of its own (token ``holder``)."""
    holder = runner_instance(team, "holder", "holder", channel_name="chan-holder")
    jobs_schedule()
    job = run.jobs.get()
    assert accept(job, holder.pk)
    return job, holder


def _hello(job: Job | None) -> str:
    if job is None:
        return HELLO.model_dump_json()
    held = protocol.HeldJob(job=str(job.pk), attempt=1, lease=current_attempt(job).lease, confirmed=True)
    return HELLO.model_copy(update={"running_jobs": [held]}).model_dump_json()


def _state(job: Job, reason: str) -> str:
    """A progress state as a runner may write it: not through the model, which cuts the reason."""
    return json.dumps({"type": "job_state", "job": str(job.pk), "attempt": 1, "state": "preparing", "reason": reason})


def _claim(job: Job) -> str:
    """An acceptance with a lease that is not the attempt's: answered ``Refused`` every time."""
    return protocol.JobAccepted(job=str(job.pk), attempt=1, lease="not-the-lease").model_dump_json()


def _logs(job: Job, seq: int) -> str:
    return protocol.Logs.of(
        job=str(job.pk), attempt=1, first_seq=seq, lines=[(1.0, "o", f"line {seq}")]
    ).model_dump_json()


HEARTBEAT = protocol.Heartbeat(state="busy").model_dump_json()


async def _said_hello(token: str, hello: str) -> WebsocketCommunicator:
    ws = runner_socket(token)
    await ws.connect()
    await ws.send_to(text_data=hello)
    welcome = json.loads(await ws.receive_from(timeout=5))
    assert welcome["type"] == "welcome"
    return ws


async def _answer(ws: WebsocketCommunicator) -> dict[str, Any]:
    return dict(json.loads(await ws.receive_from(timeout=60)))


def _reason(job: Job) -> str:
    return str(Job.objects.get(pk=job.pk).status_reason)


def _heartbeat_at(instance: Instance) -> datetime | None:
    return Instance.objects.get(pk=instance.pk).last_heartbeat_at  # type: ignore[no-any-return]


async def _settled(job: Job, reason: str) -> None:
    """Until the job's reason is ``reason`` (progress states are handled by a
    task of the connection's own, after the frames behind them)."""
    for _ in range(100):
        if await database_sync_to_async(_reason)(job) == reason:
            return
        await database_sync_to_async(time.sleep)(0.05)
    raise AssertionError(f"the job's reason is {await database_sync_to_async(_reason)(job)!r}")


def test_the_holders_1_mib_reason_is_cut_and_its_next_heartbeat_and_frame_are_answered_within_200_ms(
    team: Workspace, run: Run
) -> None:
    job, holder = _holding(team, run)
    adversarial = _state(job, ADVERSARIAL)
    assert len(adversarial) > MIB
    hello = _hello(job)

    async def scenario() -> tuple[float, dict[str, Any], datetime]:
        ws = await _said_hello("holder", hello)
        # A round of the same frames first: connections, threads and masks are warm.
        for frame in (_state(job, "warming up"), HEARTBEAT, _logs(job, 1)):
            await ws.send_to(text_data=frame)
        assert (await _answer(ws))["type"] == "log_ack"
        await _settled(job, "warming up")
        before = timezone.now()
        start = time.perf_counter()
        for frame in (adversarial, HEARTBEAT, _logs(job, 2)):
            await ws.send_to(text_data=frame)
        ack = await _answer(ws)
        took = time.perf_counter() - start
        await _settled(job, "a." * 500)
        await ws.disconnect()
        return took, ack, before

    took, ack, before = async_to_sync(scenario)()

    assert ack == {"type": "log_ack", "job": str(job.pk), "seq": 2}
    assert took < BOUND, f"answered after {took * 1000:.0f} ms"
    heard = _heartbeat_at(holder)
    assert heard is not None and heard >= before  # the heartbeat between them was handled


def test_a_1_mib_reason_from_a_runner_without_the_job_is_not_read_and_no_socket_waits(
    team: Workspace, run: Run
) -> None:
    """The reason of a runner that does not hold the job is dropped before it
    is cleaned; its own next frames and the holder's are answered within 200 ms."""
    job, _ = _holding(team, run)
    stranger = runner_instance(team, "stranger", "stranger", channel_name="chan-stranger")
    holders_hello, strangers_hello = _hello(job), _hello(None)

    async def scenario() -> tuple[float, float, dict[str, Any], dict[str, Any], datetime]:
        held = await _said_hello("holder", holders_hello)
        other = await _said_hello("stranger", strangers_hello)
        await held.send_to(text_data=_logs(job, 1))  # warm
        assert (await _answer(held))["type"] == "log_ack"
        for frame in (_state(job, "warming up"), HEARTBEAT, _claim(job)):
            await other.send_to(text_data=frame)
        assert (await _answer(other))["type"] == "refused"
        reason = await database_sync_to_async(_reason)(job)
        adversarial = _state(job, ADVERSARIAL)
        before = timezone.now()
        start = time.perf_counter()
        for frame in (adversarial, HEARTBEAT, _claim(job)):
            await other.send_to(text_data=frame)
        await held.send_to(text_data=_logs(job, 2))
        ack = await _answer(held)
        held_took = time.perf_counter() - start
        refused = await _answer(other)
        other_took = time.perf_counter() - start
        await database_sync_to_async(time.sleep)(0.3)  # the stranger's state, handled in its own task
        assert await database_sync_to_async(_reason)(job) == reason
        for ws in (held, other):
            await ws.disconnect()
        return held_took, other_took, ack, refused, before

    held_took, other_took, ack, refused, before = async_to_sync(scenario)()

    assert ack == {"type": "log_ack", "job": str(job.pk), "seq": 2}
    assert (refused["type"], refused["job"], refused["attempt"]) == ("refused", str(job.pk), 1)
    assert held_took < BOUND, f"the holder was answered after {held_took * 1000:.0f} ms"
    assert other_took < BOUND, f"the stranger was answered after {other_took * 1000:.0f} ms"
    heard = _heartbeat_at(stranger)
    assert heard is not None and heard >= before

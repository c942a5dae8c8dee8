"""Issue 11, item 9: what a runner sends cannot hurt the web process: a
runner that floods log frames without waiting for acks is cut off (1008), a
NaN or negative line time is a bad frame (4400), and a long rejection
reason is cut to what the server keeps, not refused. The real consumer over
a WebsocketCommunicator, real Postgres."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.runs.models import LogChunk
from tests.runs.test_fencing import HELLO, _connect, _runner

pytestmark = pytest.mark.django_db(transaction=True)


def _logs(seq: int, ts: Any = 1.0, job: str = "00000000-0000-0000-0000-000000000000") -> str:
    return json.dumps({"type": "logs", "job": job, "attempt": 1, "first_seq": seq,
                       "streams": "o" * 200, "times": [[200, ts]], "text": ("x" * 1000 + "\n") * 200})  # fmt: skip


def _session(
    token: str, frames: list[str], held: list[protocol.HeldJob] | None = None, after_welcome: Any = None
) -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        ws = _connect(token)
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_copy(update={"running_jobs": held or []}).model_dump_json())
        await ws.receive_from(timeout=5)  # welcome
        if after_welcome is not None:
            after_welcome()
        for frame in frames:
            await ws.send_to(text_data=frame)
        while True:
            out = await ws.receive_output(timeout=20)
            if out["type"] == "websocket.close":
                return dict(out)

    return async_to_sync(scenario)()


def test_a_runner_that_does_not_wait_for_acks_is_cut_off() -> None:
    """The log queue of one connection holds MAX_QUEUED_LOG_FRAMES frames
    waiting for the database; the next frame closes the connection (1008)
    instead of growing the web process's memory."""
    from backend.runs.consumers.runner import RunnerConsumer
    from backend.runs.services.logingest import MAX_QUEUED_LOG_FRAMES

    consumer = RunnerConsumer()
    closed: list[int] = []

    async def close(code: int | None = None, reason: str | None = None) -> None:
        closed.append(code or 0)

    consumer.close = close  # type: ignore[method-assign]
    frame = protocol.Logs.of(job="j", attempt=1, first_seq=1, lines=[(1.0, "o", "x")])

    async def flood() -> int:
        # Nothing here yields to the event loop, so the writer task never
        # takes a frame off the queue: a writer stuck in the database.
        for _ in range(MAX_QUEUED_LOG_FRAMES + 5):
            await consumer.on_logs(frame)
        queued = consumer.logs.queued()
        consumer.logs.close()  # the connection closes: the writer ends before it ever ran
        return queued

    queued = asyncio.run(flood())
    assert queued == MAX_QUEUED_LOG_FRAMES
    assert closed and set(closed) == {protocol.CLOSE_FLOODING}


@pytest.mark.parametrize(
    "change",
    [
        {"streams": "o" * 199 + "x"},  # a stream that is neither
        {"streams": "o" * 199},  # fewer letters than lines
        {"text": ("x" * 1000 + "\n") * 199 + "no newline at the end"},
        {"text": ("x" * 1000 + "\n") * 201},  # a line more than the streams say
        {"times": [[100, 1.0], [99, 2.0]]},  # runs that cover 199 lines
        {"times": [[0, 1.0], [200, 2.0]]},  # an empty run
    ],
)
def test_a_chunk_whose_parts_disagree_is_a_bad_frame(team: Workspace, change: dict[str, Any]) -> None:
    _runner(team, "shape", "shape-secret")
    frame = json.dumps({**json.loads(_logs(1)), **change})
    closed = _session("shape-secret", [frame])
    assert closed["code"] == protocol.CLOSE_BAD_MESSAGE
    assert not LogChunk.objects.exists()


@pytest.mark.parametrize("ts", [float("nan"), float("inf"), -5.0])
def test_a_line_time_that_is_not_a_unix_time_is_a_bad_frame(team: Workspace, ts: float) -> None:
    _runner(team, "clock", "clock-secret")
    frame = _logs(1).replace("[200, 1.0]", f"[200, {json.dumps(ts)}]")
    closed = _session("clock-secret", [frame])
    assert closed["code"] == protocol.CLOSE_BAD_MESSAGE


def test_a_long_rejection_reason_is_cut_not_refused() -> None:
    rejected = protocol.JobRejected(job="j", attempt=1, lease="l", reason="why " * 1000)
    assert len(rejected.reason) == 1000


def test_a_runner_whose_job_states_pile_up_is_cut_off_with_the_limit_named() -> None:
    """Progress states wait in one queue per connection: past
    MAX_QUEUED_PROGRESS unhandled the connection closes (1008) and says why,
    instead of growing the web process's memory."""
    from backend.runs.consumers.runner import MAX_QUEUED_PROGRESS, RunnerConsumer

    consumer = RunnerConsumer()
    closed: list[tuple[int, str]] = []

    async def close(code: int | None = None, reason: str | None = None) -> None:
        closed.append((code or 0, reason or ""))

    consumer.close = close  # type: ignore[method-assign]
    state = protocol.JobState(job="j", attempt=1, state="running")

    async def flood() -> int:
        # Nothing here yields to the event loop: the handler never takes a state off the queue.
        for _ in range(MAX_QUEUED_PROGRESS + 5):
            await consumer.on_job_state(state)
        waiting = consumer._progress.waiting()
        consumer._progress.close()
        return waiting

    waiting = asyncio.run(flood())
    assert waiting == MAX_QUEUED_PROGRESS
    assert {code for code, _ in closed} == {protocol.CLOSE_FLOODING}
    assert closed[0][1] == f"flooding: more than {MAX_QUEUED_PROGRESS} job states waiting to be handled"


def test_a_hello_holding_more_jobs_than_the_protocol_allows_is_closed_with_the_limit_named(team: Workspace) -> None:
    _runner(team, "many", "many-secret")
    held = [{"job": f"job-{i}", "attempt": 1, "lease": "l", "confirmed": True}
            for i in range(protocol.MAX_HELD_JOBS + 1)]  # fmt: skip

    async def scenario() -> dict[str, Any]:
        ws = _connect("many-secret")
        await ws.connect()
        hello = {**json.loads(HELLO.model_dump_json()), "running_jobs": held}
        await ws.send_to(text_data=json.dumps(hello))
        out = await ws.receive_output(timeout=5)
        await ws.wait()
        return dict(out)

    closed = async_to_sync(scenario)()
    assert closed["code"] == protocol.CLOSE_BAD_MESSAGE
    assert (
        closed["reason"]
        == f"bad frame: hello.running_jobs: List should have at most {protocol.MAX_HELD_JOBS} items after validation, not {protocol.MAX_HELD_JOBS + 1}"
    )

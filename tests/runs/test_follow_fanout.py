"""A web process's relay of a run's events to its followers
(backend/runs/consumers/fanout.py), through the real channel layer (Redis)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from redis import Redis

from backend.accounts.models import Workspace
from backend.config.asgi import application
from backend.runs.consumers import fanout
from backend.runs.events import run_group
from backend.runs.models import Run
from backend.runs.services.logs import follower_events_joined, logs_prepare_lines
from tests.support.fixtures import Person
from tests.support.frames import frame_lines

pytestmark = pytest.mark.django_db(transaction=True)


def _follower(run: Run, token: str) -> WebsocketCommunicator:
    path = f"/ws/v1/workspaces/acme/runs/{run.name}/"
    return WebsocketCommunicator(application, path, headers=[(b"authorization", f"Bearer {token}".encode())])


def _event(job: str, first: int, texts: list[str]) -> dict[str, Any]:
    """A ``run.logs`` event as the runner consumer publishes it."""
    lines = [(float(first + i), "o", text) for i, text in enumerate(texts)]
    prepared = logs_prepare_lines(job_id=job, first_seq=first, lines=lines)
    return {"type": "run.logs", "job": job, "first_seq": first, "last_seq": first + len(texts) - 1,
            "frame": prepared.frame}  # fmt: skip


async def _frames(ws: WebsocketCommunicator, count: int) -> list[dict[str, Any]]:
    return [json.loads(await ws.receive_from(timeout=5)) for _ in range(count)]


def test_followers_in_one_process_share_one_membership_and_each_get_every_event(
    team: Workspace, run: Run, member: Person
) -> None:
    job = str(run.jobs.get().pk)
    group = run_group(run.pk)

    async def scenario() -> tuple[dict[str, int], list[Any], list[Any], dict[str, int]]:
        first, second = _follower(run, member.token), _follower(run, member.token)
        for ws in (first, second):
            await ws.connect()
            assert [f["type"] for f in await _frames(ws, 1)] == ["run"]  # no lines stored yet
        joined = fanout.relayed_groups()
        await get_channel_layer().group_send(group, _event(job, 1, ["one", "two"]))
        got = [frame_lines((await _frames(ws, 1))[0]) for ws in (first, second)]
        for ws in (first, second):
            await ws.disconnect()
        return joined, got[0], got[1], fanout.relayed_groups()

    joined, first_got, second_got, after = async_to_sync(scenario)()
    assert joined == {group: 2}  # one relay, two members
    assert first_got == second_got == [[1, 1.0, "o", "one"], [2, 2.0, "o", "two"]]
    assert after == {}  # the last follower took the relay with it


def test_a_burst_of_a_jobs_events_is_joined_and_a_status_does_not_pass_the_held_lines(
    team: Workspace, run: Run, member: Person
) -> None:
    """The first event after a quiet spell goes out at once; the ones that
    follow it within FLUSH_SECONDS arrive as one frame; a status event
    published behind them arrives after them."""
    job = str(run.jobs.get().pk)
    group = run_group(run.pk)

    async def scenario() -> list[dict[str, Any]]:
        ws = _follower(run, member.token)
        await ws.connect()
        await _frames(ws, 1)  # the run
        layer = get_channel_layer()
        for seq in range(1, 6):
            await layer.group_send(group, _event(job, seq, [f"line {seq}"]))
        await layer.group_send(group, {"type": "run.status", "run": {"id": str(run.pk), "status": "running"}})
        frames = await _frames(ws, 3)
        await ws.disconnect()
        return frames

    frames = async_to_sync(scenario)()
    assert [f["type"] for f in frames] == ["logs", "logs", "run"]
    assert [line[0] for line in frame_lines(frames[0])] == [1]
    assert frame_lines(frames[1]) == [[seq, float(seq), "o", f"line {seq}"] for seq in range(2, 6)]


def test_joined_events_hold_the_same_lines_as_the_events() -> None:
    events = [
        _event("j", 1, ["a", "b"]),
        _event("j", 3, ["ünïcode", ""]),
        _event("j", 5, ["c\r"]),
    ]

    joined = follower_events_joined(events)

    assert (joined["first_seq"], joined["last_seq"]) == (1, 5)
    expected = [line for event in events for line in frame_lines(json.loads(event["frame"]))]
    assert frame_lines(json.loads(joined["frame"])) == expected
    assert [line[0] for line in expected] == [1, 2, 3, 4, 5]


def test_a_follower_that_cannot_subscribe_is_told_to_try_again_later(
    team: Workspace, run: Run, member: Person, settings: Any
) -> None:
    """The channel layer unreachable (a real refused connection): closed
    1013, which the dashboard and the CLI reconnect after, not an error."""
    layers = dict(settings.CHANNEL_LAYERS)
    layers["default"] = {
        **layers["default"],
        "CONFIG": {
            **layers["default"]["CONFIG"],
            "hosts": [{"address": "redis://127.0.0.1:1", "socket_connect_timeout": 1}],
        },
    }
    settings.CHANNEL_LAYERS = layers

    async def scenario() -> Any:
        ws = _follower(run, member.token)
        await ws.connect()
        closed = await ws.receive_output(timeout=10)
        await ws.wait()
        return closed, fanout.relayed_groups()

    closed, groups = async_to_sync(scenario)()
    assert (closed["type"], closed["code"]) == ("websocket.close", 1013)
    assert groups == {}


def test_after_redis_comes_back_empty_the_relay_joins_again_at_once(
    team: Workspace, run: Run, member: Person, settings: Any
) -> None:
    """A Redis restarted without its data (it keeps nothing on disk) has no
    memberships: the relay, whose read failed, joins again as soon as Redis
    answers, not at the next renewal (WS_RECHECK_SECONDS)."""
    job = str(run.jobs.get().pk)
    group = run_group(run.pk)
    prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    redis = Redis.from_url(settings.REDIS_URL)

    async def scenario() -> tuple[int, float, list[Any]]:
        ws = _follower(run, member.token)
        await ws.connect()
        await _frames(ws, 1)  # the run
        # The restart, as the web process sees it: its connections drop, and the memberships are gone.
        gone = redis.delete(f"{prefix}:group:{group}")
        _drop_connections(redis)
        started = time.monotonic()
        layer = get_channel_layer()
        seq = 1
        while True:
            await layer.group_send(group, _event(job, seq, [f"line {seq}"]))
            if not await ws.receive_nothing(timeout=0.5):
                break
            seq += 1
            assert time.monotonic() - started < settings.TRAINYARD["WS_RECHECK_SECONDS"], "never joined again"
        frame = json.loads(await ws.receive_from())
        await ws.disconnect()
        return gone, time.monotonic() - started, frame_lines(frame)

    gone, took, lines = async_to_sync(scenario)()
    assert gone == 1  # the membership was there, and was deleted
    assert took < 5  # RETRY_SECONDS and a join, far under the renewal's 30 s
    # The lines published while it was not a member are lost to it (it
    # catches up from storage, where this test stores none): the first it
    # got is one published after it joined again, numbered as published.
    [(seq, ts, stream, text)] = lines
    assert (ts, stream, text) == (float(seq), "o", f"line {seq}")


def _drop_connections(redis: Redis) -> None:
    """Close this process's other connections to the channel layer's Redis
    database, as a restart would (not the e2e stacks', on other databases)."""
    db = redis.connection_pool.connection_kwargs.get("db", 0)
    me = redis.client_id()
    for client in redis.client_list():
        if int(client["db"]) == db and int(client["id"]) != me:
            redis.client_kill_filter(_id=client["id"])

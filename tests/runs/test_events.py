"""Holding a run's publishing back, and what becomes of what was held.

Each test publishes a marker to the run's group after the held publish would
have gone out, so the order in which the follower receives them says whether
the run's status was sent at once, later, or not at all: no timeouts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from backend.runs.events import publish, publish_run, publishing_held, run_group
from backend.runs.models import Run

MARKER = {"type": "test.marker"}


def _follow(run: Run) -> str:
    layer = get_channel_layer()
    channel: str = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(run_group(run.pk), channel)
    return channel


def _received(channel: str, count: int) -> list[dict[str, Any]]:
    """The next ``count`` messages, read in one event loop (channels_redis
    keeps a channel's receive state per loop)."""

    async def receive() -> list[dict[str, Any]]:
        layer = get_channel_layer()
        got: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(5):
                while len(got) < count:
                    got.append(await layer.receive(channel))
        except TimeoutError:
            pytest.fail(f"{count} messages expected, {len(got)} arrived: {[m['type'] for m in got]}")
        return got

    return async_to_sync(receive)()


def test_a_held_publish_waits_for_the_caller(run: Run) -> None:
    channel = _follow(run)
    with publishing_held() as held:
        publish_run(str(run.pk))
        publish(run_group(run.pk), MARKER)
    publish_run(str(run.pk))

    assert held == {str(run.pk)}
    marker, status = _received(channel, 2)
    assert marker == MARKER
    assert status["type"] == "run.status" and status["run"]["id"] == str(run.pk)


def test_what_was_held_is_published_when_the_code_inside_fails(run: Run) -> None:
    channel = _follow(run)
    with pytest.raises(RuntimeError, match="after the commit"), publishing_held():
        publish_run(str(run.pk))
        publish(run_group(run.pk), MARKER)
        raise RuntimeError("after the commit")
    publish(run_group(run.pk), MARKER)

    # Outside the block publishing is no longer held.
    publish_run(str(run.pk))

    messages = _received(channel, 4)
    assert [m["type"] for m in messages] == ["test.marker", "run.status", "test.marker", "run.status"]
    assert {m["run"]["id"] for m in messages if m["type"] == "run.status"} == {str(run.pk)}

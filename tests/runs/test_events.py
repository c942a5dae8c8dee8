"""The runs' outbox (backend/runs/events.py): a run changed in a
transaction is published when it commits, once, in order, never when it
rolls back; a caller may hold the publishing and publish what it held.

Each test publishes a marker to the run's group after the held publish would
have gone out, so the order in which the follower receives them says whether
the run's status was sent at once, later, or not at all: no timeouts. Real
transactions: a commit runs its hooks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from backend.accounts.models import Workspace
from backend.runs.events import publish, publish_on_commit, publish_runs, publishing_held, run_group, workspace_group
from backend.runs.models import Run
from tests.support.fixtures import Person, submit

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = {"type": "test.marker"}


def _follow(run: Run) -> str:
    return _join(run_group(run.pk))


def _join(group: str) -> str:
    layer = get_channel_layer()
    channel: str = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
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
        publish_on_commit(str(run.pk))
        publish(run_group(run.pk), MARKER)
    publish_runs(held)

    assert held == [str(run.pk)]
    marker, status = _received(channel, 2)
    assert marker == MARKER
    assert status["type"] == "run.status" and status["run"]["id"] == str(run.pk)


def test_what_was_held_is_published_when_the_code_inside_fails(run: Run) -> None:
    channel = _follow(run)
    with pytest.raises(RuntimeError, match="after the commit"), publishing_held():
        publish_on_commit(str(run.pk))
        publish(run_group(run.pk), MARKER)
        raise RuntimeError("after the commit")
    publish(run_group(run.pk), MARKER)

    # Outside the block publishing is no longer held.
    publish_on_commit(str(run.pk))

    messages = _received(channel, 4)
    assert [m["type"] for m in messages] == ["test.marker", "run.status", "test.marker", "run.status"]
    assert {m["run"]["id"] for m in messages if m["type"] == "run.status"} == {str(run.pk)}


def test_a_transaction_publishes_each_run_it_changed_once_in_order_when_it_commits(
    team: Workspace, owner: Person
) -> None:
    first, second = submit(team, owner.user), submit(team, owner.user)
    channel = _join(workspace_group(team.pk))

    with transaction.atomic():
        publish_on_commit(str(second.pk))
        publish_on_commit(str(first.pk))
        publish_on_commit(str(second.pk))
        publish(workspace_group(team.pk), MARKER)  # sent at once: before the commit
    publish(workspace_group(team.pk), MARKER)

    messages = _received(channel, 4)
    assert [m["type"] for m in messages] == ["test.marker", "run.status", "run.status", "test.marker"]
    assert [messages[1]["run"]["id"], messages[2]["run"]["id"]] == [str(second.pk), str(first.pk)]


def test_a_change_rolled_back_is_not_published(run: Run) -> None:
    channel = _follow(run)

    with pytest.raises(RuntimeError, match="rolled back"), transaction.atomic():
        publish_on_commit(str(run.pk))
        raise RuntimeError("rolled back")
    with transaction.atomic(), pytest.raises(RuntimeError, match="savepoint"), transaction.atomic():
        publish_on_commit(str(run.pk))
        raise RuntimeError("savepoint")
    publish(run_group(run.pk), MARKER)
    with transaction.atomic():
        with pytest.raises(RuntimeError, match="savepoint"), transaction.atomic():
            publish_on_commit(str(run.pk))
            raise RuntimeError("savepoint")
        publish_on_commit(str(run.pk))  # what the transaction kept is published
    publish(run_group(run.pk), MARKER)

    messages = _received(channel, 3)
    assert [m["type"] for m in messages] == ["test.marker", "run.status", "test.marker"]

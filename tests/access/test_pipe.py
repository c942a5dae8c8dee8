"""The relay's pipe between two ends, through its transport (a Redis list
per receiving end, on the test settings' Valkey) and a channel layer: bytes
arrive intact and in order both ways, an end said by the server comes after
the bytes the peer sent before it, its window holds a fast sender back while
the other side reads slowly, and an event the server did not sign, or one
out of order, never reaches a socket."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from channels.layers import InMemoryChannelLayer
from django.db import connections

from backend.access import pipe as pipe_module
from backend.access import relay as relay_module
from backend.access import transport
from backend.access.models import AccessSession
from backend.access.pipe import BROKEN, CLOSED, ENDED, WINDOW_BYTES, Pipe
from backend.access.relay import open_job_stream
from backend.access.services.sessions import grant_session
from backend.access.signing import DOWN, UP, direction_key, encoded_control, encoded_data, signed
from backend.accounts.models import Workspace
from tests.access.test_sessions import running_on_a_runner
from tests.support.fixtures import Person, submit

T = TypeVar("T")
CHUNK = 64 << 10
SESSION = "00000000-0000-0000-0000-000000000001"


class Source:
    """A client that sends as fast as it is read."""

    def __init__(self) -> None:
        self.read_bytes = 0

    async def read(self) -> bytes | str | None:
        self.read_bytes += CHUNK
        return b"x" * CHUNK

    async def write(self, item: bytes | str) -> None:
        pass

    async def end(self, reason: str, code: int) -> None:
        pass


class SlowSink:
    """A job's side that has read nothing after its first frame."""

    def __init__(self) -> None:
        self.written: list[bytes | str] = []
        self.stuck = asyncio.Event()

    async def read(self) -> bytes | str | None:
        await asyncio.Event().wait()
        return None

    async def write(self, item: bytes | str) -> None:
        self.written.append(item)
        if isinstance(item, bytes):
            await self.stuck.wait()

    async def end(self, reason: str, code: int) -> None:
        self.written.append(json.dumps({"type": "end", "reason": reason}))


async def _no_text(_: str) -> str | None:
    return None


def _run(scenario: Coroutine[Any, Any, T]) -> T:
    """``scenario`` on a loop whose database work runs in one thread, whose
    connection is closed at the end (the test database is dropped after)."""

    async def closing() -> T:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        try:
            return await scenario
        finally:
            await loop.run_in_executor(None, connections.close_all)

    return asyncio.run(closing())


def _pipes(layer: Any, client_channel: str, runner_channel: str, client: Any, runner: Any) -> tuple[Pipe, Pipe]:
    common = {"session_id": SESSION, "layer": layer, "on_text": _no_text, "peer_timeout": 30.0}
    return (
        Pipe(side="client", local=client, channel=client_channel, peer=runner_channel, **common),
        Pipe(side="runner", local=runner, channel=runner_channel, peer=client_channel, **common),
    )


class Feed:
    """A socket: what is put in ``outgoing`` is read from it (None: it
    closed), what the pipe writes is kept."""

    def __init__(self, frames: list[bytes | None] | None = None) -> None:
        self.outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()
        for frame in frames or []:
            self.outgoing.put_nowait(frame)
        self.written: list[bytes | str] = []
        self.changed = asyncio.Event()

    async def read(self) -> bytes | str | None:
        return await self.outgoing.get()

    async def write(self, item: bytes | str) -> None:
        self.written.append(item)
        self.changed.set()

    async def end(self, reason: str, code: int) -> None:
        self.written.append(json.dumps({"type": "end", "reason": reason}))
        self.changed.set()

    def received(self) -> bytes:
        return b"".join(item for item in self.written if isinstance(item, bytes))

    async def until(self, size: int) -> None:
        while len(self.received()) < size:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 20)


def _pipe(layer: Any, side: str, channel: str, peer: str, local: Any) -> Pipe:
    return Pipe(
        session_id=SESSION, side=side, local=local, layer=layer, channel=channel, peer=peer,
        on_text=_no_text, peer_timeout=30.0,
    )  # fmt: skip


def _channels() -> tuple[str, str]:
    """Fresh channel names (so fresh lists) for a client and a runner end."""
    return f"specific.test!{uuid.uuid4().hex}", f"specific.test!{uuid.uuid4().hex}"


@pytest.mark.django_db(transaction=True)
def test_a_slow_reader_holds_the_sender_back_at_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipe_module, "COUNT_SECONDS", 3600.0)  # no byte count written during the test

    async def scenario() -> tuple[int, int, int]:
        layer = InMemoryChannelLayer(capacity=1000)
        source, sink = Source(), SlowSink()
        client, runner = _pipes(layer, await layer.new_channel(), await layer.new_channel(), source, sink)
        tasks = [asyncio.ensure_future(client.run()), asyncio.ensure_future(runner.run())]
        await asyncio.sleep(1.0)
        queued = runner._queue.qsize() * CHUNK
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return source.read_bytes, queued, client._inflight_bytes

    read, queued, inflight = _run(scenario())

    # The one frame the stuck writer holds, the queue behind it, and the one
    # read after the last credit: nothing more was taken from the sender.
    assert inflight <= WINDOW_BYTES + CHUNK
    assert read <= WINDOW_BYTES + 2 * CHUNK
    assert queued <= WINDOW_BYTES


@pytest.mark.django_db(transaction=True)
def test_bytes_cross_both_ways_intact_and_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipe_module, "COUNT_SECONDS", 3600.0)
    up = [bytes([i % 251]) * (1000 + i) for i in range(300)]  # more frames than a window: acks come back
    down = [os.urandom(200 << 10) for _ in range(20)]  # more bytes than a window

    async def scenario() -> tuple[Feed, Feed]:
        layer = InMemoryChannelLayer()
        client_channel, runner_channel = _channels()
        client_side, runner_side = Feed(list(up)), Feed(list(down))
        client = _pipe(layer, "client", client_channel, "", client_side)
        runner = _pipe(layer, "runner", runner_channel, client_channel, runner_side)
        await runner.announce()
        tasks = [asyncio.ensure_future(client.run()), asyncio.ensure_future(runner.run())]
        await asyncio.gather(client_side.until(sum(map(len, down))), runner_side.until(sum(map(len, up))))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return client_side, runner_side

    client_side, runner_side = _run(scenario())

    assert client_side.written[0] == json.dumps({"type": "ready"})
    assert client_side.received() == b"".join(down)
    assert runner_side.received() == b"".join(up)


@pytest.mark.django_db(transaction=True)
def test_the_servers_end_comes_after_the_bytes_the_peer_sent_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipe_module, "COUNT_SECONDS", 3600.0)

    async def scenario() -> tuple[str, str, Feed]:
        layer = InMemoryChannelLayer()
        client_channel, runner_channel = _channels()
        runner = _pipe(layer, "runner", runner_channel, client_channel, Feed([b"last ", b"words", None]))
        await runner.announce()
        runner_outcome = await asyncio.wait_for(runner.run(), 10)  # its bytes pushed, then its socket closed
        # The end reaches the client's channel before the client has read its list.
        await layer.send(client_channel, signed({"type": "relay.end", "reason": "the job ended", "code": 4409}))
        client_side = Feed()
        client = _pipe(layer, "client", client_channel, "", client_side)
        client_outcome = await asyncio.wait_for(client.run(), 10)
        return runner_outcome, client_outcome, client_side

    runner_outcome, client_outcome, client_side = _run(scenario())

    assert (runner_outcome, client_outcome) == (CLOSED, ENDED)
    assert client_side.written == [
        json.dumps({"type": "ready"}),
        b"last ",
        b"words",
        json.dumps({"type": "end", "reason": "the job ended"}),
    ]


@pytest.mark.django_db(transaction=True)
def test_an_event_the_server_did_not_sign_or_out_of_order_breaks_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipe_module, "COUNT_SECONDS", 3600.0)
    key = direction_key(SESSION, UP)

    def forged(sender: str) -> list[bytes]:
        return [encoded_data(key, sender=sender, seq=1, data=b"ok")[: -len(b"ok")] + b"rm -rf /\n"]

    def wrong_direction(sender: str) -> list[bytes]:
        return [encoded_data(direction_key(SESSION, DOWN), sender=sender, seq=1, data=b"ls\n")]

    def other_session(sender: str) -> list[bytes]:
        other = "00000000-0000-0000-0000-000000000003"
        return [encoded_data(direction_key(other, UP), sender=sender, seq=1, data=b"ls\n")]

    def skipped(sender: str) -> list[bytes]:
        return [encoded_data(key, sender=sender, seq=2, data=b"ls\n")]

    def unsigned_control(sender: str) -> list[bytes]:
        return [b"C" + json.dumps({"type": "relay.text", "text": "x", "from": sender}).encode()]

    def control_of_another_session(sender: str) -> list[bytes]:
        return [encoded_control({"type": "relay.text", "text": "x", "from": sender, "session": "another"})]

    def garbage(sender: str) -> list[bytes]:
        return [b"D\x00"]

    async def scenario(events: Callable[[str], list[bytes]]) -> tuple[str, list[bytes | str]]:
        layer = InMemoryChannelLayer(capacity=1000)
        client_channel, runner_channel = _channels()
        sink = Feed()
        runner = _pipe(layer, "runner", runner_channel, client_channel, sink)
        await transport.push(runner_channel, *events(client_channel))
        outcome = await asyncio.wait_for(runner.run(), 10)
        return outcome, sink.written

    cases = (forged, wrong_direction, other_session, skipped, unsigned_control, control_of_another_session, garbage)
    for events in cases:
        assert _run(scenario(events)) == (BROKEN, []), events.__name__

    def replayed(sender: str) -> list[bytes]:
        once = encoded_data(key, sender=sender, seq=1, data=b"ls\n")
        return [once, once]

    assert _run(scenario(replayed)) == (BROKEN, [b"ls\n"])


class Echo:
    """A job's port that answers every byte with itself."""

    def __init__(self) -> None:
        self._back: asyncio.Queue[bytes] = asyncio.Queue()

    async def read(self) -> bytes | str | None:
        return await self._back.get()

    async def write(self, item: bytes | str) -> None:
        if isinstance(item, bytes):
            await self._back.put(item)

    async def end(self, reason: str, code: int) -> None:
        pass


@pytest.mark.django_db(transaction=True)
def test_the_apps_proxys_stream_reaches_the_job_and_counts_its_bytes(
    team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = running_on_a_runner(team, owner, submit(team, owner.user))
    grant = grant_session(workspace=team, user=owner.user, run=run, job_name=None, kind="port", port=8888)
    layer = InMemoryChannelLayer(capacity=1000)
    monkeypatch.setattr(relay_module, "get_channel_layer", lambda: layer)
    sent = os.urandom(3 << 20)

    runner_channel = "specific.runner!end"  # what the runner's end recorded when it attached
    AccessSession.objects.filter(pk=grant.session.pk).update(runner_channel=runner_channel)

    async def scenario() -> bytes:
        runner = Pipe(
            session_id=str(grant.session.pk), side="runner", local=Echo(), layer=layer, channel=runner_channel,
            peer="", on_text=_no_text, peer_timeout=30.0,
        )  # fmt: skip
        serving = asyncio.ensure_future(runner.run())
        got = bytearray()
        async with open_job_stream(grant.session.pk) as stream:
            writing = asyncio.ensure_future(stream.write(sent))
            while len(got) < len(sent):
                got += await asyncio.wait_for(stream.read(), 10)
            await writing
        serving.cancel()
        return bytes(got)

    assert _run(scenario()) == sent
    session = AccessSession.objects.get(pk=grant.session.pk)
    assert (session.state, session.bytes_up, session.bytes_down) == ("ended", len(sent), len(sent))

"""One channel-layer subscription per group and process, fanned out in memory.

Everyone following a run gets the same events, so an event crosses Redis
once per process, not once per follower: a group_send to many members
writes a copy of the frame for each, and reads them back one round trip at
a time (decision 0062; bench/results/2026-12-03-followers.md).

Here a process joins a group once, with a channel of its own (a relay), and
hands each event to its websockets in memory: an event crosses Redis once
per process, and the followers share the frame's text. Each follower takes
its events from a bounded queue of its own (``Inbox``), so one that stopped
reading neither holds the others up nor holds memory without bound: past
``INBOX_CAPACITY`` its events are dropped, as the channel layer drops them
past its capacity, and it catches them up from storage (follow.py).

A job's log events are held for at most ``FLUSH_SECONDS`` after the last
delivery and joined into one (``follower_events_joined``): a job that
prints every few milliseconds costs each follower at most ten sends a
second, while a line after a quiet spell (a warm start's first) goes out at
once. Any other event (a run's status) delivers what is held first.

The relay renews its group membership every ``watch.interval()`` (the
channel layer forgets members after the group expiry) and outlives a Redis
outage: it retries its reads every second and, once Redis answers again
(a restarted Redis has no memberships), joins the group again at once;
what was published meanwhile the followers catch up from storage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import BaseChannelLayer, get_channel_layer

from backend.runs.consumers.watch import interval
from backend.runs.services.logs import follower_events_joined

logger = logging.getLogger(__name__)

INBOX_CAPACITY = 1000
RETRY_SECONDS = 1.0
FLUSH_SECONDS = 0.1
JOINED_MAX_BYTES = 1 << 20  # a joined frame grows no larger (ingest frames are up to ~1 MB each)

Handler = Callable[[dict[str, Any]], Awaitable[None]]


class Inbox:
    """A member's events, handled one at a time by ``handle`` in a task of
    its own; an exception in ``handle`` is given to ``on_error``."""

    def __init__(self, handle: Handler, on_error: Callable[[BaseException], Awaitable[None]]) -> None:
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=INBOX_CAPACITY)
        self._handle = handle
        self._on_error = on_error
        self._task = asyncio.create_task(self._drain())
        self.dropped = 0

    def deliver(self, message: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            if not self.dropped:
                logger.info("a follower's inbox is full: dropping its events (it catches up from storage)")
            self.dropped += 1

    def close(self) -> None:
        self._task.cancel()

    async def _drain(self) -> None:
        while True:
            message = await self._queue.get()
            try:
                await self._handle(message)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                await self._on_error(e)
                return


class _Relay:
    def __init__(self, layer: BaseChannelLayer, group: str) -> None:
        self.layer = layer
        self.group = group
        self.members: set[Inbox] = set()
        self.channel = ""
        self.joined: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tasks: list[asyncio.Task[None]] = []
        self.started = False
        self._held: list[dict[str, Any]] = []
        self._flush_at: asyncio.TimerHandle | None = None
        self._flushed = 0.0  # loop time of the last delivery of log events

    async def start(self) -> None:
        try:
            # The default prefix: channels_redis reads all of a process's
            # channels of one prefix from one key (one read for all of them);
            # another prefix would wait behind the others' blocking reads.
            self.channel = await self.layer.new_channel()
            await self.layer.group_add(self.group, self.channel)
        except asyncio.CancelledError:
            self.joined.cancel()
            raise
        except Exception as e:
            self.joined.set_exception(e)
            self.joined.exception()  # retrieved: the members waiting get it, or nobody does
            raise
        self.joined.set_result(None)
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._renew())]
        self.started = True

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._flush_at is not None:
            self._flush_at.cancel()
        if self.channel:
            try:
                await self.layer.group_discard(self.group, self.channel)
            except Exception:  # the membership expires on its own
                logger.warning("could not leave %s", self.group, exc_info=True)

    async def _receive(self) -> None:
        failing = False  # logged once per outage, not at every retry
        while True:
            try:
                if failing:
                    # Redis may be back empty (it keeps nothing on disk): join again at once.
                    await self.layer.group_add(self.group, self.channel)
                    logger.info("relay of %s: the channel layer answers again", self.group)
                    failing = False
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                if not failing:
                    logger.warning("relay of %s: reading from the channel layer failed", self.group, exc_info=True)
                failing = True
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if message.get("type") != "run.logs":
                self._flush()
                self._deliver(message)
                continue
            self._held.append(message)
            if self._flush_at is None:
                loop = asyncio.get_running_loop()
                wait = self._flushed + FLUSH_SECONDS - loop.time()
                if wait <= 0:
                    self._flush()  # nothing went out lately: at once
                else:
                    self._flush_at = loop.call_later(wait, self._flush)

    def _flush(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        if not self._held:
            return
        held, self._held = self._held, []
        self._flushed = asyncio.get_running_loop().time()
        for event in _joined(held):
            self._deliver(event)

    def _deliver(self, message: dict[str, Any]) -> None:
        for member in list(self.members):
            member.deliver(message)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(interval())
            try:
                await self.layer.group_add(self.group, self.channel)
            except Exception:
                logger.warning("relay of %s: renewing the membership failed; retrying", self.group, exc_info=True)


def _joined(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` with each job's consecutive ones joined (in order per job)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    sizes: dict[str, int] = {}  # each run's frames, in bytes
    out: list[dict[str, Any]] = []
    for event in events:
        job, size = event["job"], len(event["frame"])
        run = runs.get(job)
        if run and event["first_seq"] == run[-1]["last_seq"] + 1 and sizes[job] + size <= JOINED_MAX_BYTES:
            run.append(event)
            sizes[job] += size
            continue
        if run:
            out.append(follower_events_joined(run))
        runs[job], sizes[job] = [event], size
    out += [follower_events_joined(run) for run in runs.values()]
    return out


# By event loop: a relay's tasks and the channel layer's connections belong to one.
_relays: dict[asyncio.AbstractEventLoop, dict[str, _Relay]] = {}


async def join(group: str, member: Inbox) -> None:
    """``member`` gets ``group``'s events from now on (once this returns,
    every event sent to the group after it reaches the member)."""
    relays = _relays.setdefault(asyncio.get_running_loop(), {})
    relay = relays.get(group)
    if relay is None:
        relay = relays[group] = _Relay(get_channel_layer(), group)
        relay.members.add(member)
        try:
            await relay.start()
        except BaseException:
            _forget(relay)
            raise
        if not relay.members:  # every member left while it joined
            await relay.stop()
        return
    relay.members.add(member)
    try:
        await asyncio.shield(relay.joined)
    except BaseException:
        relay.members.discard(member)
        raise


async def leave(group: str, member: Inbox) -> None:
    """No more of ``group``'s events for ``member``; the process leaves the
    group with its last member."""
    relays = _relays.get(asyncio.get_running_loop(), {})
    relay = relays.get(group)
    if relay is None or member not in relay.members:
        return
    relay.members.discard(member)
    if relay.members:
        return
    _forget(relay)
    if relay.started:
        await relay.stop()
    # else: its start is under way (it stops it, finding no members) or failed


def _forget(relay: _Relay) -> None:
    loop = asyncio.get_running_loop()
    relays = _relays.get(loop, {})
    if relays.get(relay.group) is relay:
        del relays[relay.group]
    if not relays:
        _relays.pop(loop, None)


def relayed_groups() -> dict[str, int]:
    """This event loop's groups and their members' count (what the tests check)."""
    return {group: len(relay.members) for group, relay in _relays.get(asyncio.get_running_loop(), {}).items()}

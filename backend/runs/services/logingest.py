"""Log ingest of one runner connection: its ``logs`` frames stored in
order, acknowledged, and sent on to the run's followers.

``LogIngest`` is owned by the connection's consumer, which hands it each
validated frame (``put``) and callbacks to send an answer on the socket and
to close it; the consumer closes the connection with ``CLOSE_FLOODING``
when ``put`` says so. The rules it keeps (docs/RUNNER.md, "Storage on the
server"):

- One writer task stores the frames strictly in order, in a thread of the
  connection's own (one worker, its own database connection): receiving and
  validating the next frames overlaps with storing the previous ones, and
  one runner's logs neither wait for nor hold up another's or the shared
  database thread. Preparing and storing run one after the other in that
  thread, not side by side in two (bench/results/2026-12-03-log-ingest.md).
- Frames queued while a store runs are stored together (``_coalesce``: one
  transaction, one ``COPY``, one ack), up to ``MAX_STORE_LINES``.
- A batch is acknowledged as soon as it is stored; a publisher task sends
  the stored batches to the followers, in order, meanwhile, so the next
  store does not wait for the publish, unless ``MAX_UNPUBLISHED`` batches
  wait for theirs. It sends through the process's channel layer
  (``channels.layers.get_channel_layer()``, the one the consumer has).
- A frame of a job and attempt that is not the runner's any more is
  refused (``Refused``, not ``LogAck``: the runner must not believe its
  lines are kept), and that attempt's later frames on this connection are
  dropped.
- The runner's window bounds the queue; a runner that does not wait for
  acks is cut off at ``MAX_QUEUED_LOG_FRAMES`` before it can fill the
  process's memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import connections
from trainyard_runner import protocol

from backend.runs.events import run_group
from backend.runs.services.inorder import InOrder
from backend.runs.services.logs import StoredLogs, UnknownJob, logs_prepare, logs_store
from backend.runs.services.runner_session import stale

logger = logging.getLogger(__name__)

# Log frames queued on one connection before it is closed (the runner keeps
# at most logstream.WINDOW = 10 unacknowledged).
MAX_QUEUED_LOG_FRAMES = 64
# Stored batches waiting for their publish before the writer waits too.
MAX_UNPUBLISHED = 4
# A coalesced store holds at most this many lines (several frames' worth).
MAX_STORE_LINES = 40_000


class LogIngest:
    """The log frames of one connection. ``runner()`` is the connection's
    runner (its instance id), read at each store: None once the connection
    was replaced or fenced, and its frames are refused. ``send`` answers on
    the socket (``LogAck``, ``Refused``); ``close(code)`` closes it (1011:
    storing failed, and the runner resends after it reconnects)."""

    def __init__(
        self,
        *,
        runner: Callable[[], str | None],
        send: Callable[[protocol.LogAck | protocol.Refused], Awaitable[None]],
        close: Callable[[int], Awaitable[None]],
    ) -> None:
        self._runner = runner
        self._send = send
        self._close = close
        self._queue: asyncio.Queue[protocol.Logs] = asyncio.Queue()
        self._refused: set[tuple[str, int]] = set()
        self._thread: ThreadPoolExecutor | None = None
        self._writer: asyncio.Task[None] | None = None
        self._published: InOrder[StoredLogs] = InOrder(
            self._publish, failed=lambda _: "publishing stored logs to followers failed (they catch up from storage)"
        )

    def put(self, frame: protocol.Logs) -> bool:
        """Queue ``frame`` for the writer. False: the runner has
        ``MAX_QUEUED_LOG_FRAMES`` frames queued already (it does not wait
        for acks), and the caller closes the connection (``CLOSE_FLOODING``)."""
        if self._refused and (frame.job, frame.attempt) in self._refused:
            return True  # already told: the runner drops the attempt when it reads that
        if self._writer is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner-logs")
            self._writer = asyncio.create_task(self._write(self._thread))
        if self._queue.qsize() >= MAX_QUEUED_LOG_FRAMES:
            logger.warning("runner %s sent %d log frames without waiting for acks: closing", self._runner(),
                           MAX_QUEUED_LOG_FRAMES)  # fmt: skip
            return False
        self._queue.put_nowait(frame)
        return True

    def queued(self) -> int:
        """Frames waiting for the writer."""
        return self._queue.qsize()

    def close(self) -> None:
        """The connection closed: the frames still queued are dropped
        unacknowledged (the runner resends them after it reconnects), what
        is stored still reaches the followers, and the connection's thread
        closes its database connection and ends."""
        if self._writer is not None:
            self._writer.cancel()
        if self._thread is not None:
            self._thread.submit(connections.close_all)  # after a store under way: the thread's connection
            self._thread.shutdown(wait=False)
        self._published.close()

    async def _write(self, thread: ThreadPoolExecutor) -> None:
        """Prepare and store the queued frames, strictly in order, in the
        connection's thread."""
        store = database_sync_to_async(_store_frame, thread_sensitive=False, executor=thread)
        try:
            while True:
                batch = _coalesce(await self._queue.get(), self._queue)
                try:
                    stored: StoredLogs = await store(batch, self._runner())
                except UnknownJob:
                    self._refused.add((batch.job, batch.attempt))
                    await self._send(stale(batch.job, batch.attempt))
                    continue
                await self._send(protocol.LogAck(job=batch.job, seq=stored.last_seq))
                if stored.count:
                    if self._published.waiting() >= MAX_UNPUBLISHED:
                        await self._published.join()  # the followers' publishes fell behind: store no faster
                    self._published.put(stored)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("storing logs failed; closing the runner's connection so it resends")
            await self._close(1011)

    async def _publish(self, stored: StoredLogs) -> None:
        """A stored batch to the run's followers. A follower that misses one
        (this process died first) fills the gap from storage
        (consumers/follow.py)."""
        await get_channel_layer().group_send(run_group(stored.run_id), _follower_event(stored))


def _coalesce(first: protocol.Logs, queue: asyncio.Queue[protocol.Logs]) -> protocol.Logs:
    """The first queued frame, extended by the queued frames that continue it
    (string joins: no line is visited)."""
    streams, times, texts = [first.streams], list(first.times), [first.text]
    count = len(first.streams)
    while not queue.empty() and count < MAX_STORE_LINES:
        following: protocol.Logs = queue._queue[0]  # type: ignore[attr-defined]  # peek: asyncio.Queue has no peek
        if (
            following.job != first.job
            or following.attempt != first.attempt
            or following.first_seq != first.first_seq + count
        ):
            break
        queue.get_nowait()
        streams.append(following.streams)
        times += following.times
        texts.append(following.text)
        count += len(following.streams)
    if len(texts) == 1:
        return first
    return first.model_copy(update={"streams": "".join(streams), "times": times, "text": "".join(texts)})


def _store_frame(frame: protocol.Logs, instance_id: str | None) -> StoredLogs:
    if instance_id is None:  # the connection no longer speaks for a runner
        raise UnknownJob(frame.job)
    prepared = logs_prepare(
        job_id=frame.job,
        first_seq=frame.first_seq,
        streams=frame.streams,
        times=frame.times,
        text=frame.text,
        attempt=frame.attempt,
    )
    return logs_store(job_id=frame.job, instance_id=instance_id, attempt=frame.attempt, prepared=prepared)


def _follower_event(stored: StoredLogs) -> dict[str, Any]:
    first = stored.first_new_seq
    return {
        "type": "run.logs",
        "job": stored.job_id,
        "first_seq": first,
        "last_seq": first + stored.count - 1,
        "frame": stored.frame,
    }

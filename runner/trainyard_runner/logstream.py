"""One job's log lines: sequence numbers, a bounded buffer, an on-disk spool,
batching into ``Logs`` frames and acknowledgements.

Contract:

- ``put`` numbers lines consecutively from 1 in the order they arrive, writes
  them to the spool and keeps them in memory until the server acknowledges
  them. When more than ``max_lines`` / ``max_bytes`` are unacknowledged it
  waits (the reader stops reading, the job's pipe fills, the job slows down):
  lines are never dropped.
- ``take_batch`` hands out the next batch of unsent lines when one is due
  (see ``_due``) and at most ``window`` batches are unacknowledged at once.
- ``ack`` drops acknowledged lines; ``rewind`` (after a reconnect) makes the
  next batch start right after the seq the server says it has stored, reading
  from the spool if the server has fewer lines than it acknowledged before.

Everything runs on one event loop thread; there is no locking.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import itemgetter
from pathlib import Path

from .protocol import chunk_text, log_digest_add, log_digest_hex, log_digest_lines

LogLine = tuple[float, str, str]  # the wire shape: [unix time, "o"|"e", text]

MAX_BATCH_LINES = 20_000
MAX_BATCH_BYTES = 2 << 20  # keep frames well under the server's message limit (16 MiB)
BATCH_DELAY = 0.020  # seconds a ready line may wait for company
WINDOW = 10  # batches in flight


class LogStream:
    def __init__(
        self,
        job: str,
        spool_path: Path,
        *,
        max_lines: int = 200_000,
        max_bytes: int = 64 << 20,
        on_ready: Callable[[], None] = lambda: None,
        first_seq: int = 1,
        resume: bool = False,
    ) -> None:
        self.job = job
        self.spool_path = spool_path
        # Where each output file ("o", "e") was read to, by the last spooled chunk.
        self.offsets: dict[str, int] = {}
        last_seq = first_seq - 1
        # The end-of-log check's running digest of every line put (protocol.log_digest_add).
        self._digest = 0
        if resume:
            last_seq, self.offsets = spool_tail(spool_path, first_seq - 1)
            spooled = [(stream, text) for _, (_, stream, text) in read_spool(spool_path, first_seq)]
            self._digest = log_digest_lines(0, spooled)
        self._spool = spool_path.open("a", encoding="utf-8")
        self._max_lines = max_lines
        self._max_bytes = max_bytes
        self._on_ready = on_ready
        self._lines: list[LogLine] = []  # unacknowledged, _lines[0] has seq _base
        # A job's seqs continue across attempts: a retried attempt starts
        # after the lines its predecessors stored (AssignJob.seq_base).
        self._first_seq = first_seq  # this attempt's first line; earlier seqs are not ours to resend
        self._base = last_seq + 1
        self._bytes = 0
        self._next_seq = last_seq + 1  # seq the next put line gets
        self._sent = first_seq - 1  # highest seq handed out in a batch on this connection
        self._acked = first_seq - 1
        self._in_flight: deque[int] = deque()  # last seq of each unacked batch
        self._oldest_unsent_at = 0.0  # monotonic time the oldest unsent line arrived
        self._changed = asyncio.Event()
        self.closed = False  # no more lines will be put
        self._abandoned = False  # refused by the server: lines are dropped

    # ------------------------------------------------------------ producer side

    async def put(self, stream: str, texts: list[str], *, timeout: float = 1.0, offset: int | None = None) -> None:
        """Append lines; blocks (re-checking every ``timeout`` s) while the buffer is full.
        ``offset``: where the output file of ``stream`` is read to after these
        lines (spooled with them, so a later runner resumes there)."""
        if not texts or self._abandoned:
            return
        while self._full():
            await self._wait_changed(timeout)
        size = sum(map(len, texts))
        ts = round(time.time(), 6)
        first = self._next_seq
        # One spool record per chunk: [first_seq, ts, stream, [texts]] (+ offset).
        # Cheap and compact; every line of a chunk arrived at the same time on one stream.
        record: list[object] = [first, ts, stream, texts]
        if offset is not None:
            record.append(offset)
            self.offsets[stream] = offset
        self._spool.write(json.dumps(record, ensure_ascii=False))
        self._spool.write("\n")
        self._spool.flush()
        if self._sent == self._next_seq - 1:
            self._oldest_unsent_at = time.monotonic()
        self._lines.extend(zip(repeat(ts), repeat(stream), texts))
        encoded = chunk_text(texts).encode("utf-8", "surrogatepass")
        self._digest = log_digest_add(self._digest, stream * len(texts), encoded)
        self._bytes += size
        self._next_seq += len(texts)
        self._on_ready()

    def close(self) -> None:
        """No more lines: a partial batch is due at once."""
        self.closed = True
        self._spool.close()
        self._on_ready()

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    @property
    def acked(self) -> int:
        return self._acked

    @property
    def shipped(self) -> tuple[int, str]:
        """This attempt's line count and digest, for its final state."""
        return self.last_seq - self._first_seq + 1, log_digest_hex(self._digest)

    # ------------------------------------------------------------ sender side

    def take_batch(self) -> tuple[int, list[LogLine]] | None:
        """The next batch to send, or None if none is due or the window is full."""
        if not self._due(time.monotonic()):
            return None
        start = self._sent + 1 - self._base
        end = min(start + MAX_BATCH_LINES, len(self._lines))
        if _text_bytes(self._lines[start:end]) > MAX_BATCH_BYTES:  # rare: long lines
            size = 0
            for i in range(start, end):
                size += len(self._lines[i][2])
                if size > MAX_BATCH_BYTES and i > start:
                    end = i
                    break
        first_seq = self._sent + 1
        self._sent += end - start
        self._in_flight.append(self._sent)
        self._oldest_unsent_at = time.monotonic()
        return first_seq, self._lines[start:end]

    def seconds_until_due(self) -> float | None:
        """How long until a partial batch becomes due; None if nothing waits."""
        if self._unsent() == 0 or len(self._in_flight) >= WINDOW:
            return None
        return max(0.0, self._oldest_unsent_at + BATCH_DELAY - time.monotonic())

    def ack(self, seq: int) -> None:
        """The server has stored every line up to ``seq``."""
        seq = min(seq, self.last_seq)
        self._sent = max(self._sent, seq)
        while self._in_flight and self._in_flight[0] <= seq:
            self._in_flight.popleft()
        if seq <= self._acked:
            return
        self._drop_through(seq)
        self._acked = seq
        self._signal()

    def rewind(self, acked: int) -> None:
        """A new connection: the server has stored lines up to ``acked``; the
        next batch starts at ``acked + 1``."""
        acked = max(self._first_seq - 1, min(acked, self.last_seq))
        if acked < self._base - 1:
            self._reload_from_spool(acked + 1)
        self._drop_through(acked)
        self._acked = acked
        self._sent = acked
        self._in_flight.clear()
        self._oldest_unsent_at = time.monotonic()
        self._signal()

    def abandon(self) -> None:
        """The server refuses this attempt's lines: drop them, send no more.
        Whatever waits for the stream to drain stops waiting (the spool stays
        on disk until the job's files are removed)."""
        self._abandoned = True
        if not self.closed:
            self.close()
        self._lines.clear()
        self._bytes = 0
        self._base = self._next_seq
        self._acked = self._sent = self.last_seq
        self._in_flight.clear()
        self._signal()

    def in_flight(self) -> int:
        return len(self._in_flight)

    def drained(self) -> bool:
        """Closed and every line acknowledged."""
        return self.closed and self._acked == self.last_seq

    async def wait_acked(self, timeout: float) -> bool:
        """Wait until every line put so far is acknowledged (closed or not); False on timeout."""
        deadline = time.monotonic() + timeout
        while self._acked < self.last_seq:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await self._wait_changed(min(left, 1.0))
        return True

    async def wait_drained(self, timeout: float) -> bool:
        """Wait until ``drained()``; False on timeout."""
        deadline = time.monotonic() + timeout
        while not self.drained():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await self._wait_changed(min(left, 1.0))
        return True

    # ------------------------------------------------------------ helpers

    def _due(self, now: float) -> bool:
        # Send at once when nothing is in flight (first-line latency), when a
        # full batch is ready or the stream ended; otherwise let lines gather
        # for at most BATCH_DELAY so the server gets fewer, larger frames.
        unsent = self._unsent()
        if unsent == 0 or len(self._in_flight) >= WINDOW:
            return False
        if not self._in_flight or self.closed or unsent >= MAX_BATCH_LINES:
            return True
        return now - self._oldest_unsent_at >= BATCH_DELAY

    def _unsent(self) -> int:
        return self.last_seq - self._sent

    def _full(self) -> bool:
        return len(self._lines) >= self._max_lines or self._bytes >= self._max_bytes

    def _drop_through(self, seq: int) -> None:
        n = seq - self._base + 1
        if n <= 0:
            return
        self._bytes -= _text_bytes(self._lines[:n])
        del self._lines[:n]
        self._base = seq + 1

    def _reload_from_spool(self, from_seq: int) -> None:
        # The server lost lines it had acknowledged (e.g. a restored database):
        # put them back in front of what is still in memory.
        older = [line for seq, line in read_spool(self.spool_path, from_seq) if seq < self._base]
        self._lines[:0] = older
        self._bytes += _text_bytes(older)
        self._base = from_seq

    def _signal(self) -> None:
        self._changed.set()
        self._on_ready()

    async def _wait_changed(self, timeout: float) -> None:
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)


def _text_bytes(lines: list[LogLine]) -> int:
    """The length of the lines' texts, counted without a Python step per line."""
    return sum(map(len, map(itemgetter(2), lines)))


def read_spool(path: Path, from_seq: int = 1) -> Iterator[tuple[int, LogLine]]:
    """Yield ``(seq, line)`` for every spooled line with seq >= ``from_seq``.

    A torn last record (the runner died mid-write) is skipped.
    """
    with path.open(encoding="utf-8") as f:
        for raw in f:
            try:
                first, ts, stream, texts, *_ = json.loads(raw)
            except ValueError:
                continue
            for i, text in enumerate(texts):
                if first + i >= from_seq:
                    yield first + i, (ts, stream, text)


def spool_tail(path: Path, none: int) -> tuple[int, dict[str, int]]:
    """The last seq of the spool's whole records (``none`` when it has none)
    and the output offset of each stream's last record. A torn record (the
    runner died mid-write) and anything after it are cut off the file, so
    what is appended next starts on a line of its own and the torn record's
    lines are read again from the output file, with the same seqs."""
    last, good = none, 0
    offsets: dict[str, int] = {}
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return last, offsets
    with f:
        for raw in f:
            try:
                first, _, stream, texts, *rest = json.loads(raw)
            except ValueError:
                break
            if not raw.endswith(b"\n"):
                break
            good += len(raw)
            last = first + len(texts) - 1
            if rest:
                offsets[stream] = int(rest[0])
    if good < path.stat().st_size:
        os.truncate(path, good)
    return last, offsets

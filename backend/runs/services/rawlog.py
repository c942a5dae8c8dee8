"""A job's log as plain text: the raw read-back (``…/jobs/<job>/logs/raw``).

The view asks ``raw_log_chunks`` for the bytes of a range of the log and
streams them as they come. Where the lines are stored is the ``LogReader``'s
business: today they are chunk rows in the database (``ChunkLogReader``);
archived storage adds a reader and a branch in ``log_reader_for``, and
nothing above it changes.

A chunk's text is the plain log already, so the server does no work per
line unless timestamps are asked for: a batch of chunks costs one query,
and only the first and last chunk of a range are cut.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Protocol

from django.db import connection
from django.db.models import Sum

from backend.artifacts.locations import storage_of
from backend.runs.models import Attempt, Job, LogArchive, LogChunk
from backend.runs.services.logchunks import (
    LAST_SEQ,
    READ_ROWS,
    Chunk,
    chunks_backward,
    chunks_forward,
    clipped,
    tail_start,
)


@dataclass(frozen=True)
class RawLogRange:
    """What part of the log to read, and how.

    ``from_seq`` and ``to_seq`` are inclusive; ``tail`` keeps the last
    ``tail`` lines of that range (``None``: all of them)."""

    from_seq: int = 1
    to_seq: int | None = None
    tail: int | None = None
    timestamps: bool = False


@dataclass(frozen=True)
class RawBatch:
    first_seq: int
    last_seq: int
    data: bytes  # the lines, each ended by "\n"


class LogReader(Protocol):
    """Reads a job's stored lines in seq order. Implementations hold no
    tenancy check: the caller already found the job in its workspace."""

    def batches(self, *, after: int, until: int, timestamps: bool, rows: int = READ_ROWS) -> Iterator[RawBatch]:
        """The lines with ``after < seq <= until``, in batches in seq order,
        each of at most ``rows`` chunks (of at most CHUNK_BYTES of text)."""
        ...

    def batches_newest_first(self, *, after: int, until: int, rows: int) -> Iterator[RawBatch]:
        """The same lines without timestamps, in batches of at most ``rows``
        chunks from the end: each batch's lines in seq order, the batches newest first."""
        ...

    def tail_start(self, *, count: int, until: int) -> int:
        """The seq of the ``count``-th line from the end of the lines up to
        ``until`` (the first line if there are fewer); 0 if there is none."""
        ...


def log_reader_for(job: Job) -> LogReader:
    """The reader of ``job``'s log where it is stored now."""
    return ChunkLogReader(job_id=str(job.pk))


ARCHIVE_URL_SECONDS = 300


def raw_log_archive_url(*, job: Job, wanted: RawLogRange, filename: str) -> str | None:
    """A short-lived URL of the job's archived log object, when it is what
    ``wanted`` asks for byte for byte: the whole log, without timestamps, of
    a job that ran once (no attempt marks), archived with every stored line
    (no line stored after). None otherwise: then the server streams it."""
    if wanted != RawLogRange():
        return None
    archive = LogArchive.objects.filter(job=job).first()
    if archive is None or archive.last_seq != job.last_seq or Attempt.objects.filter(job=job).count() > 1:
        return None
    if LogChunk.objects.filter(job=job, archive_offset__isnull=True).exists():
        return None
    return storage_of(archive).signed_url(archive.key, method="GET", seconds=ARCHIVE_URL_SECONDS, filename=filename)


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``start`` .. ``end`` - 1 of a log whose body is ``total`` bytes."""

    start: int
    end: int
    total: int


class RangeNotSatisfiable(Exception):
    def __init__(self, total: int) -> None:
        super().__init__(total)
        self.total = total


def raw_log_byte_range(*, job: Job, header: str) -> ByteRange | None:
    """The part of the whole log (no timestamps) an HTTP ``Range: bytes=``
    header asks for; None when the header is not one range of bytes or the
    job ran more than once (its body has attempt marks between the lines):
    then the whole log is the answer, as HTTP allows. Raises
    RangeNotSatisfiable when the range starts past the end."""
    found = _RANGE.fullmatch(header)
    if found is None or found.group(1) == found.group(2) == "":
        return None
    first, last = found.groups()
    if first and last and int(last) < int(first):
        return None
    if Attempt.objects.filter(job=job).count() > 1:
        return None
    total = int(LogChunk.objects.filter(job=job).aggregate(total=Sum("size"))["total"] or 0)
    if first:
        start, end = int(first), (int(last) + 1 if last else total)
    else:  # a suffix: the last N bytes
        start, end = max(total - int(last), 0), total
    if start >= total:
        raise RangeNotSatisfiable(total)
    return ByteRange(start, min(end, total), total)


def raw_log_bytes(*, job: Job, wanted: ByteRange) -> Iterator[bytes]:
    """The bytes of ``wanted``: the chunks it overlaps, found by their sizes'
    running sum, the first and last cut to it."""
    with connection.cursor() as cursor:
        cursor.execute(_OFFSETS_SQL, {"job": str(job.pk), "start": wanted.start, "end": wanted.end})
        rows = cursor.fetchall()
    if not rows:
        return
    at = int(rows[0][1])  # where the first overlapping chunk starts in the body
    first_seq, last_seq = int(rows[0][0]), int(rows[-1][0])
    for chunk in chunks_forward(str(job.pk), after=first_seq - 1, until=last_seq):
        piece = chunk.text[max(wanted.start - at, 0) : max(wanted.end - at, 0)]
        at += len(chunk.text)
        if piece:
            yield piece
        if at >= wanted.end:
            return


# One range of bytes. Every quantifier is possessive, so a header of spaces
# and digits is matched in one pass (``\s*`` around an empty ``\d*`` would
# try every split of a run of spaces).
_RANGE = re.compile(r"\s*+bytes\s*+=\s*+(\d*+)\s*+-\s*+(\d*+)\s*+", re.IGNORECASE)
# Each chunk's offset in the body: the running sum of the sizes before it.
_OFFSETS_SQL = """
SELECT first_seq, at FROM (
    SELECT first_seq, sum(size) OVER (ORDER BY first_seq) - size AS at, size FROM runs_logchunk WHERE job_id = %(job)s
) offsets
WHERE at < %(end)s AND at + size > %(start)s
ORDER BY first_seq
"""


def raw_log_chunks(*, job: Job, wanted: RawLogRange, reader: LogReader | None = None) -> Iterator[bytes]:
    """The bytes of ``job``'s log over ``wanted``: each line as stored, ended
    by ``\\n``, both streams in the order printed, with a mark line where each
    attempt starts and ends when the job ran more than once (the same marks
    ``trainyard logs`` prints). The caller checked tenancy on ``job``.

    1. A tail moves the range's start to its N-th line from the end.
    2. The range is cut where each attempt starts, so no batch spans two.
    3. Before a batch, the marks of attempts it reaches; after the last
       batch, when the range runs to the log's end, the last attempt's end.
    """
    reader = reader or log_reader_for(job)
    until = wanted.to_seq if wanted.to_seq is not None else LAST_SEQ
    start = wanted.from_seq
    if wanted.tail is not None:
        if wanted.tail == 0:
            return
        start = max(start, reader.tail_start(count=wanted.tail, until=until))
        if start == 0:
            return
    marks = _Marks(job, wanted.timestamps, start=start)
    for after, end in _segments(start - 1, until, marks.boundaries()):
        for batch in reader.batches(after=after, until=end, timestamps=wanted.timestamps):
            yield marks.up_to(batch.first_seq) + batch.data
    if wanted.to_seq is None:
        yield marks.rest()


class ChunkLogReader:
    """Lines stored as ``runs_logchunk`` rows (``logchunks.py``)."""

    def __init__(self, *, job_id: str) -> None:
        self.job_id = job_id

    def batches(self, *, after: int, until: int, timestamps: bool, rows: int = READ_ROWS) -> Iterator[RawBatch]:
        """A batch per query's worth of chunks (``rows``), their texts
        joined; a gap between chunks (lines past the cap are not stored)
        costs nothing."""
        pending: list[Chunk] = []
        for chunk in chunks_forward(self.job_id, after=after, until=until, rows=rows):
            pending.append(clipped(chunk, after=after, until=until))
            if len(pending) == rows:
                yield _batch(pending, timestamps)
                pending = []
        if pending:
            yield _batch(pending, timestamps)

    def batches_newest_first(self, *, after: int, until: int, rows: int) -> Iterator[RawBatch]:
        pending: list[Chunk] = []
        for chunk in chunks_backward(self.job_id, after=after, until=until, rows=rows):
            pending.append(clipped(chunk, after=after, until=until))
            if len(pending) == rows:
                yield _batch(pending[::-1], timestamps=False)
                pending = []
        if pending:
            yield _batch(pending[::-1], timestamps=False)

    def tail_start(self, *, count: int, until: int) -> int:
        return tail_start(self.job_id, count=count, until=until)


def _batch(chunks: list[Chunk], timestamps: bool) -> RawBatch:
    if not timestamps:
        return RawBatch(chunks[0].first_seq, chunks[-1].last_seq, b"".join(c.text for c in chunks))
    out = []
    for chunk in chunks:
        for stamp, line in zip(chunk.times(), chunk.text.split(b"\n"), strict=False):
            out.append(_line_stamp(stamp) + line + b"\n")
    return RawBatch(chunks[0].first_seq, chunks[-1].last_seq, b"".join(out))


def _line_stamp(ts: float) -> bytes:
    """``2026-12-02T12:00:00.123456Z `` (UTC, microseconds): the line's time, then a space."""
    second, micro = divmod(round(ts * 1_000_000), 1_000_000)
    return f"{_second(second)}.{micro:06d}Z ".encode()


@lru_cache(maxsize=256)
def _second(second: int) -> str:
    """Lines come in bursts within the same second: format each second once."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def _segments(after: int, until: int, boundaries: list[int]) -> Iterator[tuple[int, int]]:
    """(after, until] cut before each boundary seq inside it."""
    for boundary in boundaries:
        if after < boundary - 1 < until:
            yield after, boundary - 1
            after = boundary - 1
    if after < until:
        yield after, until


class _Marks:
    """Where each attempt starts and ends, as ``trainyard logs`` marks it
    (cli ``output.AttemptMarks``: the same lines). A job that ran once gets
    none. A range that starts inside an attempt gets only that attempt's
    start mark, not those of the attempts before it."""

    def __init__(self, job: Job, timestamps: bool, *, start: int) -> None:
        attempts = list(Attempt.objects.filter(job=job).select_related("instance").order_by("number"))
        self._job = job.name
        self._timestamps = timestamps
        self._pending = attempts if len(attempts) > 1 else []
        while len(self._pending) > 1 and self._pending[1].first_seq <= start:
            self._pending.pop(0)
        self._open: Attempt | None = None

    def boundaries(self) -> list[int]:
        return [a.first_seq for a in self._pending]

    def up_to(self, seq: int) -> bytes:
        lines: list[tuple[datetime | None, str]] = []
        while self._pending and self._pending[0].first_seq <= seq:
            if self._open is not None:
                lines.append(self._ended(self._open))
            self._open = self._pending.pop(0)
            lines.append(self._started(self._open))
        return self._render(lines)

    def rest(self) -> bytes:
        lines = []
        while self._pending:
            if self._open is not None:
                lines.append(self._ended(self._open))
            self._open = self._pending.pop(0)
            lines.append(self._started(self._open))
        if self._open is not None and self._open.termination_reason not in ("", "done"):
            lines.append(self._ended(self._open))
        return self._render(lines)

    def _started(self, a: Attempt) -> tuple[datetime | None, str]:
        resumed = f" · resumed from checkpoint {a.restored_checkpoint}" if a.restored_checkpoint else ""
        where = _where(a)
        placed = f" · {where}" if where != "-" else ""
        name = a.instance.name if a.instance else "-"
        return a.started_at or a.created_at, f"--- attempt {a.number} of {self._job} on {name}{resumed}{placed} ---"

    @staticmethod
    def _ended(a: Attempt) -> tuple[datetime | None, str]:
        message = f" ({a.termination_message})" if a.termination_message else ""
        reason = a.termination_reason or "unknown"
        return a.finished_at or a.started_at or a.created_at, f"--- attempt {a.number} ended: {reason}{message} ---"

    def _render(self, lines: list[tuple[datetime | None, str]]) -> bytes:
        if self._timestamps:
            return "".join(f"{_stamp(ts)} {text}\n" for ts, text in lines).encode()
        return "".join(f"{text}\n" for _, text in lines).encode()


def _where(a: Attempt) -> str:
    """cli ``output.attempt_where``: type, zone and market of a cloud machine."""
    i = a.instance
    if i is None or i.backend in ("local", "self-hosted") or not i.instance_type:
        return "-"
    market = "spot" if i.spot else "on-demand"
    return f"{i.instance_type} {i.zone or i.region or '?'} ({market})"


def _stamp(ts: datetime | None) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if ts is not None else "-"

"""A job's log as chunks: the rows of ``runs_logchunk`` (``LogChunk``).

A chunk is a run of consecutive lines of one job, stored as one row: its
seqs (``first_seq`` .. ``last_seq``, none missing), one stream letter per
line, one float64 time per line (network byte order, 8 bytes each), and
the lines' text in UTF-8, each line ended by ``\\n``. The text column is
the plain log already: the raw read-back sends it as it is, and no code
runs per line to store a batch or to read a range back
(docs/decisions/0054-log-chunks.md).

A stored batch becomes chunks of at most CHUNK_LINES lines (fewer when
they are long: CHUNK_BYTES), so a page read near any seq decodes a bounded
amount. Chunks never overlap (the writer trims a batch to the job's
watermark under the job's row lock); there may be gaps between them (lines
past the log cap are not stored).

Once a job has ended, its chunks' texts are compacted into one object in
the workspace's storage (``logarchive.py``): a chunk row then keeps its
seqs, streams and times, and ``archive_offset`` says where its ``size``
bytes of text are. Readers here fill an archived chunk's text in with one
ranged read per run of adjacent chunks, so nothing above this module knows
whether a log is archived.

Only this module, ``logarchive.py`` and tests/support/logfill.py know the
layout.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any
from uuid import UUID

from django.db import connection
from trainyard_runner.protocol import NEWLINE_STANDIN, LogLineWire  # ␤: a "\n" inside a line is stored as this

from backend.artifacts.locations import storage_of
from backend.core.errors import ApplicationError
from backend.runs.models import LogArchive

CHUNK_LINES = 1000
LAST_SEQ = 2**62  # "to the end" of a range
CHUNK_BYTES = 1 << 20
# Chunks read per query when walking a range.
READ_ROWS = 64
_SWAP = sys.byteorder == "little"


@dataclass(frozen=True)
class Chunk:
    first_seq: int
    last_seq: int
    streams: str
    stamps: bytes
    text: bytes  # b"" while archived and not read in
    archive_offset: int | None = None

    def __len__(self) -> int:
        return self.last_seq - self.first_seq + 1

    def texts(self) -> list[str]:
        return self.text.decode("utf-8", "surrogatepass").split("\n")[:-1]

    def times(self) -> array[float]:
        return stamps_decode(self.stamps)

    def lines(self) -> list[tuple[int, float, str, str]]:
        """(seq, unix time, stream, text) of every line."""
        first = self.first_seq
        return [
            (first + i, ts, stream, text)
            for i, (ts, stream, text) in enumerate(zip(self.times(), self.streams, self.texts(), strict=True))
        ]

    def offset(self, seq: int) -> int:
        """The byte offset in ``text`` where line ``seq`` starts (``len(text)``
        past the last line)."""
        at = 0
        for _ in range(max(0, min(seq, self.last_seq + 1) - self.first_seq)):
            at = self.text.index(b"\n", at) + 1
        return at


def stamps_encode(times: Sequence[float]) -> bytes:
    packed = array("d", times)
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def stamps_decode(raw: bytes) -> array[float]:
    packed = array("d")
    packed.frombytes(raw)
    if _SWAP:
        packed.byteswap()
    return packed


def chunks_of(first_seq: int, lines: list[LogLineWire], joined: str | None = None) -> list[Chunk]:
    """The chunks that store ``lines`` (seqs from ``first_seq``). ``joined``:
    their texts joined by "\\n", when the caller has it already."""
    texts = [text for _, _, text in lines]
    if joined is None or joined.count("\n") != len(lines) - 1:
        texts = [t.replace("\n", NEWLINE_STANDIN) if "\n" in t else t for t in texts]
        joined = None
    out: list[Chunk] = []
    for start in range(0, len(lines), CHUNK_LINES):
        end = min(start + CHUNK_LINES, len(lines))
        whole = joined if joined is not None and start == 0 and end == len(lines) else "\n".join(texts[start:end])
        out += _bounded(first_seq + start, lines[start:end], whole)
    return out


def _bounded(first_seq: int, lines: list[LogLineWire], joined: str) -> list[Chunk]:
    """One chunk of ``lines``, or two halves (recursively) when its text is
    over CHUNK_BYTES and it has more than one line."""
    text = (joined + "\n").encode("utf-8", "surrogatepass")
    if len(text) > CHUNK_BYTES and len(lines) > 1:
        half = len(lines) // 2
        return _bounded(first_seq, lines[:half], "\n".join(t for _, _, t in lines[:half])) + _bounded(
            first_seq + half, lines[half:], "\n".join(t for _, _, t in lines[half:])
        )
    return [
        Chunk(
            first_seq,
            first_seq + len(lines) - 1,
            "".join(stream for _, stream, _ in lines),
            stamps_encode([ts for ts, _, _ in lines]),
            text,
        )
    ]


def chunks_of_text(first_seq: int, streams: str, stamps: bytes, text: bytes) -> list[Chunk]:
    """The chunks that store a batch already in the stored form (a runner's
    ``Logs`` frame): ``text`` is every line followed by ``\\n``, ``stamps``
    one packed time per line. Cut every CHUNK_LINES lines (halved while over
    CHUNK_BYTES) with C-level calls only: the lines are never visited one by
    one in Python."""
    parts = text.split(b"\n")  # the last is the empty rest after the final "\n"
    out: list[Chunk] = []
    start, at = 0, 0
    count = len(streams)
    while start < count:
        lines = min(CHUNK_LINES, count - start)
        size = sum(map(len, parts[start : start + lines])) + lines
        while size > CHUNK_BYTES and lines > 1:
            lines //= 2
            size = sum(map(len, parts[start : start + lines])) + lines
        out.append(
            Chunk(
                first_seq + start,
                first_seq + start + lines - 1,
                streams[start : start + lines],
                stamps[8 * start : 8 * (start + lines)],
                text[at : at + size],
            )
        )
        start, at = start + lines, at + size
    return out


# The columns' types, in chunks_write's order, for the binary COPY.
COPY_TYPES = ["uuid", "int8", "int8", "text", "bytea", "bytea", "int4"]


def chunks_write(job_id: str, chunks: list[Chunk]) -> None:
    """Store ``chunks`` of job ``job_id`` with one COPY. The caller holds the
    job's row lock and has trimmed them to above its watermark."""
    if not chunks:
        return
    raw = connection.cursor().cursor  # the psycopg cursor under Django's wrapper
    columns = "job_id, first_seq, last_seq, streams, stamps, text, size"
    job = UUID(str(job_id))
    # Binary: the text goes as it is, not as twice its size in hex to be parsed back.
    with raw.copy(f"COPY runs_logchunk ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(COPY_TYPES)
        for c in chunks:
            copy.write_row((job, c.first_seq, c.last_seq, c.streams, c.stamps, c.text, len(c.text)))


def chunks_delete(job_id: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM runs_logchunk WHERE job_id = %s", [job_id])


_COLUMNS = "first_seq, last_seq, streams, stamps, text, size, archive_offset"
_FORWARD_SQL = f"""
SELECT {_COLUMNS} FROM runs_logchunk
WHERE job_id = %(job)s AND last_seq > %(after)s AND first_seq <= %(until)s
ORDER BY last_seq LIMIT %(rows)s
"""
_BACKWARD_SQL = f"""
SELECT {_COLUMNS} FROM runs_logchunk
WHERE job_id = %(job)s AND first_seq <= %(until)s AND last_seq > %(after)s
ORDER BY first_seq DESC LIMIT %(rows)s
"""
_COUNTS_BACKWARD_SQL = """
SELECT first_seq, last_seq FROM runs_logchunk
WHERE job_id = %(job)s AND first_seq <= %(until)s
ORDER BY first_seq DESC LIMIT %(rows)s
"""


def chunks_forward(job_id: str, *, after: int, until: int, rows: int = READ_ROWS) -> Iterator[Chunk]:
    """The chunks holding any line with ``after < seq <= until``, in seq
    order, read ``rows`` at a time (the first and last may hold lines
    outside the range: ``clipped`` cuts them)."""
    return _walk(job_id, after=after, until=until, rows=rows, forward=True)


def chunks_backward(job_id: str, *, after: int, until: int, rows: int = 8) -> Iterator[Chunk]:
    """As ``chunks_forward``, newest first."""
    return _walk(job_id, after=after, until=until, rows=rows, forward=False)


def _walk(job_id: str, *, after: int, until: int, rows: int, forward: bool) -> Iterator[Chunk]:
    """Keyset pages of ``rows`` chunks; each page narrows the range past the last one read."""
    while True:
        with connection.cursor() as cursor:
            sql = _FORWARD_SQL if forward else _BACKWARD_SQL
            cursor.execute(sql, {"job": job_id, "after": after, "until": until, "rows": rows})
            found = _read_in(job_id, cursor.fetchall())
        yield from found
        if len(found) < rows:
            return
        if forward:
            after = found[-1].last_seq
        else:
            until = found[-1].first_seq - 1


def _read_in(job_id: str, rows: list[tuple[Any, ...]]) -> list[Chunk]:
    """Chunks of fetched rows, archived texts read in from the job's
    archive: one ranged read per run of chunks adjacent in the object."""
    chunks = [Chunk(f, la, s, bytes(st), bytes(t), off) for f, la, s, st, t, _, off in rows]
    archived = [(i, int(off), int(size)) for i, (*_, size, off) in enumerate(rows) if off is not None]
    if not archived:
        return chunks
    read = archive_reader(job_id)
    for run in _adjacent(archived):
        start, end = min(off for _, off, _ in run), max(off + size for _, off, size in run)
        data = read(start, end)
        for i, off, size in run:
            chunks[i] = replace(chunks[i], text=data[off - start : off - start + size])
    return chunks


class LogArchiveGone(ApplicationError):
    """The job's archived log went away while it was read: retention deleted
    it (object, archive row and chunks) between the read of the chunk rows
    and the read of the archive."""

    status_code = HTTPStatus.GONE

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"The log of job {job_id} is no longer stored: it was deleted (log retention) while it was"
            " being read. Reload to see what is left of it.",
            extra={"job": job_id},
        )


def archive_reader(job_id: str) -> Callable[[int, int], bytes]:
    """Reads byte ranges of the job's archived log, where it is stored;
    ``LogArchiveGone`` when the archive or its object is gone."""
    archive = LogArchive.objects.filter(job_id=job_id).first()
    if archive is None:  # an archive row is made in the transaction that empties the chunks
        raise LogArchiveGone(job_id)
    storage = storage_of(archive)
    key = archive.key

    def read(start: int, end: int) -> bytes:
        try:
            return storage.read_range(key, start, end)
        except FileNotFoundError:  # retention deletes the object before its transaction commits
            raise LogArchiveGone(job_id) from None

    return read


def _adjacent(archived: list[tuple[int, int, int]]) -> Iterator[list[tuple[int, int, int]]]:
    """(row index, offset, size) grouped into runs whose bytes touch (in
    either order: a backward read lists them newest first)."""
    run: list[tuple[int, int, int]] = []
    for item in archived:
        if run and not (item[1] == run[-1][1] + run[-1][2] or item[1] + item[2] == run[-1][1]):
            yield run
            run = []
        run.append(item)
    if run:
        yield run


def tail_start(job_id: str, *, count: int, until: int) -> int:
    """The seq of the ``count``-th stored line from the end of those up to
    ``until`` (the first stored line if there are fewer); 0 if none. Reads
    only the seqs of the chunks it walks back over."""
    left, first, rows = count, 0, 64
    while True:
        with connection.cursor() as cursor:
            cursor.execute(_COUNTS_BACKWARD_SQL, {"job": job_id, "until": until, "rows": rows})
            found = cursor.fetchall()
        for first_seq, last_seq in found:
            last = min(last_seq, until)
            if last - first_seq + 1 >= left:
                return int(last - left + 1)
            left -= last - first_seq + 1
            first = int(first_seq)
        if len(found) < rows:
            return first
        until = found[-1][0] - 1


def clipped(chunk: Chunk, *, after: int, until: int) -> Chunk:
    """``chunk`` without its lines outside ``after < seq <= until``."""
    first, last = max(chunk.first_seq, after + 1), min(chunk.last_seq, until)
    if first == chunk.first_seq and last == chunk.last_seq:
        return chunk
    start, end = chunk.offset(first), chunk.offset(last + 1)
    i, j = first - chunk.first_seq, last - chunk.first_seq + 1
    return Chunk(first, last, chunk.streams[i:j], chunk.stamps[8 * i : 8 * j], chunk.text[start:end])

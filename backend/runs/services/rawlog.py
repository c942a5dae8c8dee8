"""A job's log as plain text: the raw read-back (``…/jobs/<job>/logs/raw``).

The view asks ``raw_log_chunks`` for the bytes of a range of the log and
streams them as they come. Where the lines are stored is the ``LogReader``'s
business: today every line is a ``LogLine`` row (``DatabaseLogReader``);
chunked or archived storage adds a reader and a branch in ``log_reader_for``,
and nothing above it changes.

Postgres joins each batch of lines into one string (``string_agg``), so the
server does no Python work per line: a batch costs one query and one encode.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from django.db import connection, transaction

from backend.runs.models import Attempt, Job

# A batch covers at most BATCH_SEQS seqs, fewer when its lines are long: the
# next batch's width is scaled so that it holds about BATCH_BYTES of text.
# The first batch is narrow, so one of 64 KiB lines stays a few MiB.
BATCH_SEQS = 50_000
BATCH_BYTES = 4 << 20
FIRST_BATCH_SEQS = 256
LAST_SEQ = 2**62


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

    def batches(self, *, after: int, until: int, timestamps: bool) -> Iterator[RawBatch]:
        """The lines with ``after < seq <= until``, in batches in seq order."""
        ...

    def tail_start(self, *, count: int, until: int) -> int:
        """The seq of the ``count``-th line from the end of the lines up to
        ``until`` (the first line if there are fewer); 0 if there is none."""
        ...


def log_reader_for(job: Job) -> LogReader:
    """The reader of ``job``'s log where it is stored now."""
    return DatabaseLogReader(job_id=str(job.pk))


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


class DatabaseLogReader:
    """Lines stored as ``runs_logline`` rows, read by keyset over the
    primary key (job_id, seq)."""

    def __init__(self, *, job_id: str) -> None:
        self.job_id = job_id

    def batches(self, *, after: int, until: int, timestamps: bool) -> Iterator[RawBatch]:
        """Batches by seq range, not by LIMIT: one aggregate over an index
        range, with no window to sum sizes (a LIMIT and a running sum of
        sizes measured 2.5x slower). An empty range (a gap: lines past the
        cap are not stored) skips to the next stored seq."""
        sql = _BATCH_SQL.format(line=_STAMPED if timestamps else "text")
        width = FIRST_BATCH_SEQS
        while after < until:
            end = min(until, after + width)
            with transaction.atomic(), connection.cursor() as cursor:
                # An index scan hands the aggregate its rows in seq order, so
                # Postgres 16+ skips the sort; a bitmap scan needs one.
                cursor.execute("SET LOCAL enable_bitmapscan = off")
                cursor.execute(sql, {"job": self.job_id, "after": after, "end": end})
                first, last, text, size = cursor.fetchone()
                if first is None:
                    cursor.execute(_NEXT_SQL, {"job": self.job_id, "after": end, "until": until})
                    (following,) = cursor.fetchone()
            if first is None:
                if following is None:
                    return
                after = following - 1
                continue
            yield RawBatch(first, last, text.encode("utf-8", "surrogatepass"))
            after = end
            width = max(1, min(BATCH_SEQS, width * BATCH_BYTES // max(size, 1)))

    def tail_start(self, *, count: int, until: int) -> int:
        with connection.cursor() as cursor:
            cursor.execute(_TAIL_SQL, {"job": self.job_id, "until": until, "skip": count - 1})
            row = cursor.fetchone()
            if row is not None:
                return int(row[0])
            cursor.execute(_FIRST_SQL, {"job": self.job_id, "until": until})
            row = cursor.fetchone()
        return int(row[0]) if row is not None else 0


# string_agg's ORDER BY is what orders the text, whatever the plan.
_BATCH_SQL = """
SELECT min(seq), max(seq), string_agg({line}, E'\\n' ORDER BY seq) || E'\\n', sum(octet_length(text))
FROM runs_logline
WHERE job_id = %(job)s AND seq > %(after)s AND seq <= %(end)s
"""
_NEXT_SQL = "SELECT min(seq) FROM runs_logline WHERE job_id = %(job)s AND seq > %(after)s AND seq <= %(until)s"
_STAMPED = """to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || ' ' || text"""
# A backward scan of the primary key: cheap however long the log.
_TAIL_SQL = """
SELECT seq FROM runs_logline WHERE job_id = %(job)s AND seq <= %(until)s ORDER BY seq DESC OFFSET %(skip)s LIMIT 1
"""
_FIRST_SQL = "SELECT min(seq) FROM runs_logline WHERE job_id = %(job)s AND seq <= %(until)s HAVING count(*) > 0"


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

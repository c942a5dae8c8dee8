"""Windows of a job's log for the dashboard's viewer, and search within it.

The viewer holds a bounded window of a long log (docs/LOGS.md, "Windows and
search"): it opens at the tail, reads the lines before or after what it holds
as the user scrolls, and asks where the next or previous match of a search is.

This module reads only through two interfaces, so that the storage behind
them can change (chunked or archived logs): ``job_log_page`` (lines with their
seq, time and stream) and the job's ``LogReader`` (``log_reader_for``:
``tail_start`` and raw ``batches`` either way). It holds no SQL. A search
reads at most its byte budget (TRAINYARD_LOG_SEARCH_BYTES) per request. The caller checked
tenancy on ``job``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from backend.runs.models import Job
from backend.runs.selectors import LogPage, job_log_page
from backend.runs.services.logchunks import LAST_SEQ
from backend.runs.services.rawlog import RawBatch, log_reader_for

# A search reads this many chunks (each at most CHUNK_BYTES of text) at a
# time, and checks its byte budget between them.
SEARCH_ROWS = 8
# SGR and other CSI sequences: a search for "error" finds "\x1b[31merror".
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

Direction = Literal["next", "prev"]


@dataclass(frozen=True)
class LogWindow:
    """Lines (seq, ts, stream, text) in seq order; ``has_more``: lines are
    left in the direction read (after the last one for ``after_seq``,
    before the first one for ``before_seq`` and ``tail``)."""

    lines: list[tuple[int, float, str, str]]
    has_more: bool


def log_lines_before(*, job: Job, before_seq: int | None, limit: int, max_bytes: int) -> LogWindow:
    """The last ``limit`` lines with seq < ``before_seq`` (of the whole log
    when it is None: a tail), in seq order, at most ``max_bytes`` of text.

    1. The reader finds the seq ``limit + 1`` lines from the end, so one
       page tells whether lines are left before the window.
    2. When the lines do not fit in ``max_bytes`` the page stops short of the
       end; then fewer lines are asked for, until they reach it: the lines
       next to ``before_seq`` are the ones the viewer needs.
    """
    until = min(before_seq - 1, LAST_SEQ) if before_seq is not None else LAST_SEQ
    if until < 1:
        return LogWindow([], False)
    reader = log_reader_for(job)
    count = limit
    while True:
        start = reader.tail_start(count=count + 1, until=until)
        if start == 0:
            return LogWindow([], False)
        page = job_log_page(job=job, after_seq=start - 1, limit=count + 1, max_bytes=max_bytes, until=until)
        if not page.has_more or count == 1:
            return _trimmed(page, count)
        count = max(1, min(count // 2, len(page.lines) - 1))


def log_lines_after(*, job: Job, after_seq: int, limit: int, max_bytes: int) -> LogWindow:
    """The first ``limit`` lines with seq > ``after_seq``, a page at a time."""
    page = job_log_page(job=job, after_seq=min(after_seq, LAST_SEQ), limit=limit, max_bytes=max_bytes)
    return LogWindow(page.lines, page.has_more)


@dataclass(frozen=True)
class LogSearch:
    """Where a search got to. ``seq``: the nearest matching line, None when
    none was found in what was read. ``partial``: the byte budget ran out
    before the search reached the end ("next") or the start ("prev") of the
    log; ``searched_to`` is then the last seq it read (for "prev" the first),
    and a search from just past it goes on where this one stopped."""

    seq: int | None
    partial: bool = False
    searched_to: int | None = None


def log_search(
    *, job: Job, text: str, from_seq: int, direction: Direction, max_bytes: int, budget_bytes: int
) -> LogSearch:
    """The seq of the nearest line containing ``text`` (case-insensitive,
    ANSI escapes ignored): the first at or after ``from_seq`` for "next", the
    last at or before it for "prev". Reads the log in raw batches of at most
    SEARCH_ROWS chunks, away from ``from_seq``, and stops after the batch
    that takes it to ``budget_bytes`` (so it reads at most that plus one
    batch). Attempt marks are not searched (they are not stored lines)."""
    needle = _plain(text).lower()
    if not needle:
        return LogSearch(None)
    from_seq = min(from_seq, LAST_SEQ)  # a seq past any stored one, in the database's range
    reader = log_reader_for(job)
    if direction == "next":
        batches = reader.batches(after=max(0, from_seq - 1), until=LAST_SEQ, timestamps=False, rows=SEARCH_ROWS)
    else:
        batches = reader.batches_newest_first(after=0, until=from_seq, rows=SEARCH_ROWS)
    read = 0
    for batch in batches:
        plain = _plain(batch.data.decode("utf-8", "replace")).lower()
        at = plain.find(needle) if direction == "next" else plain.rfind(needle)
        if at >= 0:
            return LogSearch(_seq_at(job, batch, plain.count("\n", 0, at), max_bytes))
        read += len(batch.data)
        if read >= budget_bytes:
            edge = batch.last_seq if direction == "next" else batch.first_seq
            more = edge < job.last_seq if direction == "next" else edge > 1
            return LogSearch(None, partial=more, searched_to=edge if more else None)
    return LogSearch(None)


def _seq_at(job: Job, batch: RawBatch, index: int, max_bytes: int) -> int:
    """The seq of the batch's ``index``-th line (from 0). A batch without gaps has one line per seq; one with a gap
    (lines past a log cap are not stored) is asked line by line of the pages."""
    if batch.last_seq - batch.first_seq == batch.data.count(b"\n") - 1:
        return batch.first_seq + index
    after = batch.first_seq - 1
    while True:
        page = job_log_page(job=job, after_seq=after, limit=index + 1, max_bytes=max_bytes, until=batch.last_seq)
        if index < len(page.lines) or not page.has_more:
            return page.lines[min(index, len(page.lines) - 1)][0]
        index -= len(page.lines)
        after = page.lines[-1][0]


def _plain(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def _trimmed(page: LogPage, count: int) -> LogWindow:
    """The last ``count`` lines of a page that asked for ``count + 1``."""
    lines = page.lines
    return LogWindow(lines[-count:] if len(lines) > count else lines, len(lines) > count)

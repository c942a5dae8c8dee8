"""Log chunks (``services/logchunks.py``): a batch becomes a few rows, a
range reads back the same lines whatever the chunk boundaries and gaps,
and the migration turns lines stored one row each into chunks and back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from trainyard_runner import protocol

from backend.runs.models import Job, LogChunk, Run
from backend.runs.selectors import job_log_lines, job_log_page
from backend.runs.services import logchunks
from backend.runs.services.logchunks import CHUNK_LINES, chunks_of, chunks_write, tail_start
from backend.runs.services.rawlog import ChunkLogReader

pytestmark = pytest.mark.django_db(transaction=True)


def _lines(first: int, count: int, width: int = 0) -> list[tuple[float, str, str]]:
    return [(1_800_000_000.5 + i, "oe"[i % 3 == 0], f"line {first + i}" + "x" * width) for i in range(count)]


@pytest.fixture
def job(run: Run) -> Job:
    return run.jobs.get()


def _store(job: Job, first: int, lines: list[tuple[float, str, str]]) -> None:
    chunks_write(str(job.pk), chunks_of(first, lines))


def test_a_batch_is_a_chunk_per_thousand_lines_and_reads_back_as_it_was(job: Job) -> None:
    lines = _lines(1, 2 * CHUNK_LINES + 5)
    _store(job, 1, lines)

    chunks = list(LogChunk.objects.filter(job=job).order_by("first_seq").values_list("first_seq", "last_seq"))
    assert chunks == [(1, 1000), (1001, 2000), (2001, 2005)]
    assert job_log_lines(job_id=str(job.pk)) == [(i + 1, ts, s, t) for i, (ts, s, t) in enumerate(lines)]


def test_long_lines_make_smaller_chunks(job: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logchunks, "CHUNK_BYTES", 10_000)
    _store(job, 1, _lines(1, 40, width=1000))  # ~41 KB of text

    sizes = [
        len(bytes(t)) for t in LogChunk.objects.filter(job=job).order_by("first_seq").values_list("text", flat=True)
    ]
    assert len(sizes) > 4 and max(sizes) <= 10_000
    assert [seq for seq, *_ in job_log_lines(job_id=str(job.pk))] == list(range(1, 41))


@pytest.mark.parametrize("width", [0, 3000])
def test_a_runners_frame_is_cut_into_the_same_chunks_as_its_lines(
    job: Job, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    """The consumer's path (``chunks_of_text`` of a ``Logs`` frame, no line
    visited) stores byte for byte what the lines' path stores: \\r, tabs,
    NUL, an empty line, non-ASCII and a lone surrogate kept; cut at
    CHUNK_LINES and, for long lines, below CHUNK_BYTES."""
    monkeypatch.setattr(logchunks, "CHUNK_BYTES", 100_000)
    odd = ["progress 10%\r20%\r", "a\tb\x00c", "", "héllo ✓ 日本", "bad \udcff byte"]
    lines = [
        (1_800_000_000.25 + i // 7, "oe"[i % 5 == 0], odd[i % 5] + "x" * width) for i in range(2 * CHUNK_LINES + 9)
    ]
    frame = protocol.Logs.of(job=str(job.pk), attempt=1, first_seq=41, lines=lines)
    stamps = logchunks.stamps_encode(protocol.chunk_times(frame.times))
    from_frame = logchunks.chunks_of_text(41, frame.streams, stamps, frame.text.encode("utf-8", "surrogatepass"))

    by_lines = chunks_of(41, lines)
    for part in ("text", "streams", "stamps"):
        assert b"".join(_bytes(getattr(c, part)) for c in from_frame) == b"".join(
            _bytes(getattr(c, part)) for c in by_lines
        )
    assert from_frame[0].first_seq == 41 and from_frame[-1].last_seq == 40 + len(lines)
    assert all(a.last_seq + 1 == b.first_seq for a, b in pairwise(from_frame))
    assert all(len(c.text) <= 100_000 and len(c) <= CHUNK_LINES for c in from_frame)
    if width == 0:
        assert from_frame == by_lines  # short lines: the same cuts, every CHUNK_LINES
    chunks_write(str(job.pk), from_frame)
    assert job_log_lines(job_id=str(job.pk)) == [(41 + i, ts, s, t) for i, (ts, s, t) in enumerate(lines)]


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def test_pages_ranges_and_tails_cross_chunk_boundaries_and_gaps(job: Job) -> None:
    _store(job, 1, _lines(1, 1500))
    _store(job, 1501, _lines(1501, 700))
    _store(job, 5000, _lines(5000, 10))  # a gap: 2201..4999 were never stored

    page = job_log_page(job=job, after_seq=995, limit=10, max_bytes=1 << 20)
    assert [seq for seq, *_ in page.lines] == list(range(996, 1006)) and page.has_more
    across = job_log_page(job=job, after_seq=2195, limit=10, max_bytes=1 << 20)
    assert [seq for seq, *_ in across.lines] == [2196, 2197, 2198, 2199, 2200, *range(5000, 5005)]
    assert [seq for seq, *_ in job_log_lines(job_id=str(job.pk), after_seq=1499, until=1502)] == [1500, 1501, 1502]

    assert tail_start(str(job.pk), count=10, until=2**62) == 5000
    assert tail_start(str(job.pk), count=12, until=2**62) == 2199
    assert tail_start(str(job.pk), count=3, until=1600) == 1598
    assert tail_start(str(job.pk), count=10**6, until=2**62) == 1

    raw = b"".join(b.data for b in ChunkLogReader(job_id=str(job.pk)).batches(after=998, until=5001, timestamps=False))
    assert raw.decode().splitlines() == [f"line {i}" for i in (*range(999, 2201), 5000, 5001)]


def test_a_page_stops_at_its_byte_limit_but_always_holds_a_line(job: Job) -> None:
    _store(job, 1, _lines(1, 20, width=100))

    page = job_log_page(job=job, after_seq=0, limit=1000, max_bytes=350)
    assert [seq for seq, *_ in page.lines] == [1, 2, 3] and page.has_more
    one = job_log_page(job=job, after_seq=0, limit=1000, max_bytes=10)
    assert [seq for seq, *_ in one.lines] == [1] and one.has_more


# ------------------------------------------------------------- the migration

BEFORE = [("runs", "0014_runs_list_keyset_indexes")]
AFTER = [("runs", "0015_log_chunks")]
T0 = datetime(2026, 12, 2, 12, 0, 0, 123456, tzinfo=UTC)


def _migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(sorted(executor.loader.applied_migrations)).apps


@pytest.fixture
def _back_to_latest() -> Iterator[None]:
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.usefixtures("_back_to_latest")
def test_the_migration_turns_stored_lines_into_chunks_and_back(run: Run) -> None:
    job_id = str(run.jobs.get().pk)
    _migrate(BEFORE)
    # 2,500 lines, a gap, then lines 2,600..2,602: one with a newline, one not ASCII.
    rows = [(s, T0 + timedelta(seconds=s), "oe"[s % 2], f"line {s}") for s in range(1, 2501)]
    rows += [(2600, T0, "o", "two\nlines"), (2601, T0, "e", "ünïcödé ✓"), (2602, T0, "o", "")]
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO runs_logline (job_id, seq, ts, stream, text) VALUES (%s, %s, %s, %s, %s)",
            [(job_id, *row) for row in rows],
        )

    _migrate(AFTER)

    chunks = list(LogChunk.objects.filter(job_id=job_id).order_by("first_seq").values_list("first_seq", "last_seq"))
    assert chunks == [(1, 1000), (1001, 2000), (2001, 2500), (2600, 2602)]
    stored = job_log_lines(job_id=job_id)
    expected = [(s, ts.timestamp(), stream, text.replace("\n", "\u2424")) for s, ts, stream, text in rows]
    assert stored == expected

    _migrate(BEFORE)

    with connection.cursor() as cursor:
        cursor.execute("SELECT seq, ts, stream, text FROM runs_logline WHERE job_id = %s ORDER BY seq", [job_id])
        back = cursor.fetchall()
    assert back == [(s, ts, stream, text.replace("\n", "\u2424")) for s, ts, stream, text in rows]


def test_a_chunk_of_another_uuid_is_not_read(job: Job) -> None:
    _store(job, 1, _lines(1, 3))
    assert job_log_lines(job_id=str(uuid.uuid4())) == []


def test_the_bench_and_test_filler_writes_what_the_server_reads(job: Job, settings: Any) -> None:
    """tests/support/logfill.py knows the layout without Django: its chunks
    read back through the server's own readers."""
    from tests.support.logfill import NOISY_TEXT, fill_job_log
    from tests.support.testdb import django_test_db_url

    size = fill_job_log(django_test_db_url(), str(job.pk), 2500)

    lines = job_log_lines(job_id=str(job.pk))
    assert [(seq, text) for seq, _, _, text in lines] == [(i + 1, NOISY_TEXT.format(i)) for i in range(2500)]
    assert lines[1][1] - lines[0][1] == pytest.approx(0.001, abs=1e-6)
    assert size == sum(len(NOISY_TEXT.format(i)) + 1 for i in range(2500))

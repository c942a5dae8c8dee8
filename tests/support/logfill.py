"""Fill a job's stored log directly in the database, for benchmarks and
tests that need a finished job of millions of lines without a runner
printing them (bench/rawlogs.py, the dashboard's long-log tests).

The one place outside ``backend/runs/services/logs.py`` that knows how
lines are stored: when the storage changes, this changes with it."""

from __future__ import annotations

import sys
from array import array
from typing import Any

NOISY_TEXT = "line {:09d} the quick brown fox jumps over the lazy dog"
T0 = 1_796_212_800.0  # 2026-12-02 12:00:00 UTC: line i is stamped T0 + i ms


def fill_job_log(database_url: str, job: str, lines: int, text: str = NOISY_TEXT) -> int:
    """Replace job ``job``'s lines by ``lines`` lines of stdout, line i
    (from 0) being ``text.format(i)``, seqs 1..lines, stored as chunks of
    CHUNK_LINES lines as the server stores them, and move its watermark
    there. Returns the bytes of the log as plain text (each line ended by a
    newline): what a raw read-back of it should send."""
    import psycopg

    size = 0
    with psycopg.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM runs_logchunk WHERE job_id = %s", [job])
        cur.execute("DELETE FROM runs_logarchive WHERE job_id = %s", [job])
        columns = "job_id, first_seq, last_seq, streams, stamps, text, size"
        with cur.copy(f"COPY runs_logchunk ({columns}) FROM STDIN") as copy:
            for start in range(0, lines, CHUNK_LINES):
                end = min(start + CHUNK_LINES, lines)
                data = "".join(text.format(i) + "\n" for i in range(start, end)).encode()
                stamps = _stamps_encode([T0 + i / 1000 for i in range(start, end)])
                copy.write_row((job, start + 1, end, "o" * (end - start), stamps, data, len(data)))
                size += len(data)
        cur.execute("UPDATE runs_job SET last_seq = %s WHERE id = %s", [lines, job])
        cur.execute("ANALYZE runs_logchunk")
    return size


def empty_job_log(database_url: str, job: str) -> None:
    """Remove every stored line of ``job`` and reset its watermark."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        conn.execute("DELETE FROM runs_logchunk WHERE job_id = %s", [job])
        conn.execute("DELETE FROM runs_logarchive WHERE job_id = %s", [job])
        conn.execute("UPDATE runs_job SET last_seq = 0 WHERE id = %s", [job])


def line_time(conn: Any, job: str, *, text: str | None = None) -> float | None:
    """The time (Unix seconds) of the job's first line, or of its first
    line that is exactly ``text``; None if there is none. ``conn``: a
    psycopg connection."""
    rows = conn.execute(
        "SELECT stamps, text FROM runs_logchunk WHERE job_id = %s AND archive_offset IS NULL ORDER BY first_seq",
        (job,),
    )
    for stamps, data in rows:
        lines = bytes(data).decode("utf-8", "surrogatepass").split("\n")
        for ts, line in zip(_stamps_decode(bytes(stamps)), lines, strict=False):
            if text is None or line == text:
                return ts
    return None


# The layout of backend/runs/services/logchunks.py, without Django (benches
# run outside it): CHUNK_LINES lines a chunk, times as float64 big-endian.
CHUNK_LINES = 1000


def _stamps_encode(times: list[float]) -> bytes:
    packed = array("d", times)
    if sys.byteorder == "little":
        packed.byteswap()
    return packed.tobytes()


def _stamps_decode(raw: bytes) -> array[float]:
    packed = array("d")
    packed.frombytes(raw)
    if sys.byteorder == "little":
        packed.byteswap()
    return packed

"""Fill a job's stored log directly in the database, for benchmarks and
tests that need a finished job of millions of lines without a runner
printing them (bench/rawlogs.py, the dashboard's long-log tests).

The one place outside ``backend/runs/services/logs.py`` that knows how
lines are stored: when the storage changes, this changes with it."""

from __future__ import annotations

NOISY_TEXT = "line {:09d} the quick brown fox jumps over the lazy dog"


def fill_job_log(database_url: str, job: str, lines: int, text: str = NOISY_TEXT) -> int:
    """Replace job ``job``'s lines by ``lines`` lines of stdout, line i
    (from 0) being ``text.format(i)``, seqs 1..lines, and move its
    watermark there. Returns the bytes of the log as plain text (each line
    ended by a newline): what a raw read-back of it should send."""
    import psycopg

    with psycopg.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM runs_logline WHERE job_id = %s", [job])
        with cur.copy("COPY runs_logline (job_id, seq, ts, stream, text) FROM STDIN") as copy:
            step = 100_000
            for start in range(0, lines, step):
                rows = "".join(
                    f"{job}\t{i + 1}\t2026-12-02 12:00:00+00\to\t{text.format(i)}\n"
                    for i in range(start, min(start + step, lines))
                )
                copy.write(rows.encode())
        cur.execute("UPDATE runs_job SET last_seq = %s WHERE id = %s", [lines, job])
        cur.execute("ANALYZE runs_logline")
    return sum(len(text.format(i).encode()) + 1 for i in range(lines))


def empty_job_log(database_url: str, job: str) -> None:
    """Remove every stored line of ``job`` and reset its watermark."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        conn.execute("DELETE FROM runs_logline WHERE job_id = %s", [job])
        conn.execute("UPDATE runs_job SET last_seq = 0 WHERE id = %s", [job])

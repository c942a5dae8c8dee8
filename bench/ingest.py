"""Part ``ingest-parallel`` of ``make bench`` (bench/README.md): ten
``noisy`` jobs printing at once, the server storing them all.

The local pool is raised to the number of jobs for this part (web and
worker restarted with TRAINYARD_LOCAL_RUNNERS_MAX, then put back), so every
job has its own runner; as many `sleep 2` runs at once first leave that many
runners idle, and the noisy runs are POSTed concurrently. The clock runs from the earliest first line printed
(its stored time) to the moment the jobs' stored watermarks add up to every
line, polled every 0.2 s; then each job's stored chunks are counted, so a
line lost or stored twice shows. Target (issue 12): ≥ 300,000 lines/s
aggregate, none lost.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.lib import Api, log
from tests.support.logfill import line_time
from tests.support.stack import Stack

TARGET_PARALLEL_LINES_PER_S = 300_000.0
TIMEOUT = 600.0
FINISHED = {"succeeded", "failed", "stopped"}


def bench_parallel_ingest(api: Api, stack: Stack, jobs: int, lines: int) -> dict[str, Any]:
    log(f"(7) {jobs} noisy jobs of {lines:,} lines at once, each on its own runner")
    with stack.env_changed({"TRAINYARD_LOCAL_RUNNERS_MAX": str(jobs)}, restart=["web", "worker"]):
        return _measure(api, stack, jobs, lines)


# Holds each warm-up job long enough that all of them need a runner of their own.
WARM_UP = "\n  - name: bench-warm-up\n    provider: bash\n    commands:\n      - sleep 2\n"


def _submit_at_once(api: Api, jobs: int, workflow: str, env: dict[str, str], text: str | None) -> list[dict[str, Any]]:
    """``jobs`` runs POSTed concurrently, each from a client of its own."""

    def one(_: int) -> dict[str, Any]:
        with api.new_client() as client:
            return api.submit(workflow, env, client=client, workflows_text=text)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, range(jobs)))


def _measure(api: Api, stack: Stack, jobs: int, lines: int) -> dict[str, Any]:
    import psycopg

    # Warm runners, as in the latency part: the clock measures storing lines,
    # not ten Python processes starting at once on this machine.
    log(f"    warm-up: {jobs} runs of `sleep 2` at once, so {jobs} local runners wait idle")
    for run in _submit_at_once(api, jobs, "bench-warm-up", {}, api.workflows_text + WARM_UP):
        done = api.wait_finished(run["id"], timeout=300)
        if done["status"] != "succeeded":
            raise RuntimeError(f"warm-up run {done['name']} ended {done['status']}: {done.get('status_reason')}")
    runs = _submit_at_once(api, jobs, "noisy", {"LINES": str(lines)}, None)
    total, stored_at = jobs * lines, None
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        found = [api.run(r["id"]) for r in runs]
        stored = sum(j["last_seq"] for r in found for j in r["jobs"])
        if stored >= total and stored_at is None:
            stored_at = time.time()
        if all(r["status"] in FINISHED for r in found):
            break
        time.sleep(0.2)
    job_ids = [r["jobs"][0]["id"] for r in found]
    with psycopg.connect(stack.database_url) as conn:
        first = [line_time(conn, job) for job in job_ids]
        counts = [
            int(
                conn.execute(
                    "SELECT coalesce(sum(last_seq - first_seq + 1), 0) FROM runs_logchunk WHERE job_id = %s", [job]
                ).fetchone()[0]
            )
            for job in job_ids
        ]
        timeline = _timeline(conn, job_ids, first)
    lost = sum(max(lines - n, 0) for n in counts)
    twice = sum(max(n - lines, 0) for n in counts)
    started = min(t for t in first if t is not None) if any(first) else None
    seconds = (stored_at - started) if stored_at is not None and started is not None else None
    return {
        "jobs": jobs,
        "lines_each": lines,
        "statuses": sorted({r["status"] for r in found}),
        "stored_lines": sum(counts),
        "lost": lost,
        "stored_twice": twice,
        "seconds": round(seconds, 3) if seconds is not None else None,
        "lines_per_s": round(total / seconds) if seconds else None,
        # How far apart the jobs began: the runners' own start is inside the clock.
        "first_lines_spread_s": round(max(t for t in first if t) - started, 3) if started is not None else None,
        "timeline": timeline,
    }


def _timeline(conn: Any, job_ids: list[str], first: list[float | None]) -> list[dict[str, Any]]:
    """Per job, seconds after the first submission: submitted, assigned (its
    attempt made), started (the runner's acceptance), its first line: what
    sets the spread of the first lines."""
    rows = []
    for job, first_line in zip(job_ids, first, strict=True):
        row = conn.execute(
            "SELECT extract(epoch FROM j.created_at), extract(epoch FROM a.created_at),"
            " extract(epoch FROM a.started_at), a.instance_id"
            " FROM runs_job j JOIN runs_attempt a ON a.job_id = j.id AND a.number = j.attempt WHERE j.id = %s",
            [job],
        ).fetchone()
        rows.append(
            {
                "submitted": float(row[0]),
                "assigned": float(row[1]) if row[1] is not None else None,
                "started": float(row[2]) if row[2] is not None else None,
                "instance": str(row[3]),
                "first_line": first_line,
            }
        )
    zero = min(r["submitted"] for r in rows)
    for r in rows:
        for key in ("submitted", "assigned", "started", "first_line"):
            if r[key] is not None:
                r[key] = round(r[key] - zero, 3)
    return sorted(rows, key=lambda r: r["submitted"])


def ingest_rows(result: dict[str, Any], row: Any) -> None:
    rate = result["lines_per_s"]
    ok = rate is not None and rate >= TARGET_PARALLEL_LINES_PER_S and result["lost"] == 0
    value = f"{rate:,} lines/s" if rate is not None else "did not finish"
    row(
        f"ingest, {result['jobs']} noisy jobs at once (aggregate; lost {result['lost']}, twice {result['stored_twice']})",
        value,
        f"≥ {TARGET_PARALLEL_LINES_PER_S:,.0f} lines/s, none lost",
        ok,
    )
    for r in result.get("timeline", []):
        log(
            f"    job on {r['instance']}: submitted {r['submitted']:.2f} s, assigned {r['assigned']}, "
            f"started {r['started']}, first line {r['first_line']}"
        )
    if result.get("first_lines_spread_s") is not None:
        row("(info) the jobs' first lines spread over", f"{result['first_lines_spread_s']:.2f} s", "–", None)

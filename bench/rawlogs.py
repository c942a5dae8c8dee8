"""Bench part ``raw-logs``: the raw read-back of a finished job's log.

A ``hello`` run finishes; its job's log is then replaced by LINES lines
written with COPY (as fast as Postgres takes them, not through a runner),
and the bench times ``GET …/jobs/<job>/logs/raw`` over HTTP (the whole body
read, lines counted) and ``trainyard logs <run>`` to /dev/null, best of
RAW_REPEATS each. The lines are deleted afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.lib import Api, log
from tests.support.logfill import empty_job_log, fill_job_log
from tests.support.stack import Stack

RAW_REPEATS = 3
RAW_TIMEOUT = 300.0
TARGET_RAW_LINES_PER_S = 1_000_000.0
TRAINYARD = Path(sys.executable).parent / "trainyard"


def bench_raw_logs(api: Api, stack: Stack, lines: int, home: Path) -> dict[str, Any]:
    """The job's log in database chunks, then archived into the storage (the
    state of every job two minutes after it ended)."""
    log(f"(6) raw read-back: a finished job of {lines:,} lines (COPY), over HTTP and `trainyard logs`")
    run = api.wait_finished(api.submit("hello")["id"])
    job = run["jobs"][0]["id"]
    expected = fill_job_log(stack.database_url, job, lines)
    try:
        http = [_http_once(api, job, lines, expected) for _ in range(RAW_REPEATS)]
        cli = [_cli_once(api, run["name"], home) for _ in range(RAW_REPEATS)]
        log("(6) … the same job archived into the storage")
        started = time.perf_counter()
        stack.manage(
            "shell",
            "-c",
            f"from backend.runs.services.logarchive import log_archive_job; log_archive_job(job_id={job!r})",
        )
        archive_seconds = time.perf_counter() - started
        archived_http = [_http_once(api, job, lines, expected) for _ in range(RAW_REPEATS)]
        archived_cli = [_cli_once(api, run["name"], home) for _ in range(RAW_REPEATS)]
    finally:
        empty_job_log(stack.database_url, job)
    best_http, best_cli = min(http), min(cli)
    return {
        "archive_seconds": round(archive_seconds, 2),
        "archived_http_seconds": [round(s, 3) for s in archived_http],
        "archived_http_lines_per_s": round(lines / min(archived_http)),
        "archived_cli_seconds": [round(s, 3) for s in archived_cli],
        "archived_cli_lines_per_s": round(lines / min(archived_cli)),
        "run": run["name"],
        "lines": lines,
        "bytes": expected,
        "http_seconds": [round(s, 3) for s in http],
        "http_lines_per_s": round(lines / best_http),
        "http_mb_per_s": round(expected / best_http / 1e6, 1),
        "cli_seconds": [round(s, 3) for s in cli],
        "cli_lines_per_s": round(lines / best_cli),
    }


def raw_rows(raw: dict[str, Any], row: Any) -> None:
    n = raw["lines"]
    for label, key in ((f"raw read-back over HTTP, finished job of {n:,} lines", "http_lines_per_s"),
                       ("`trainyard logs` > /dev/null, same job", "cli_lines_per_s"),
                       ("  the same, archived: over HTTP (streamed from the object)", "archived_http_lines_per_s"),
                       ("  the same, archived: `trainyard logs` (redirect to the object)",
                        "archived_cli_lines_per_s")):  # fmt: skip
        row(
            label,
            f"{raw[key]:,} lines/s",
            f"≥ {TARGET_RAW_LINES_PER_S:,.0f} lines/s",
            raw[key] >= TARGET_RAW_LINES_PER_S,
        )


def _http_once(api: Api, job: str, lines: int, expected: int) -> float:
    url = f"/api/v1/workspaces/{api.workspace}/jobs/{job}/logs/raw"
    size = count = 0
    with api.new_client() as client:
        started = time.perf_counter()
        with client.stream("GET", url, timeout=RAW_TIMEOUT) as response:
            response.raise_for_status()
            for chunk in response.iter_bytes(1 << 20):
                size += len(chunk)
                count += chunk.count(b"\n")
        seconds = time.perf_counter() - started
    if (count, size) != (lines, expected):
        raise RuntimeError(f"raw read-back returned {count} lines, {size} bytes; expected {lines}, {expected}")
    return seconds


def _cli_once(api: Api, run: str, home: Path) -> float:
    env = {**os.environ, "TRAINYARD_URL": api.url, "TRAINYARD_TOKEN": api.token, "HOME": str(home)}
    started = time.perf_counter()
    with open(os.devnull, "wb") as devnull:
        subprocess.run([str(TRAINYARD), "logs", run], stdout=devnull, env=env, check=True, timeout=RAW_TIMEOUT)
    return time.perf_counter() - started

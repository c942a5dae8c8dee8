"""(6) The runs list at scale: a workspace seeded with a million runs (one
job each) by COPY, then the p50 of the first page, page 1,000 reached by
its cursor, a filter and a search, over HTTP against the running web
process, and each case's queries counted in this process (Django's test
client on the same database). Nothing is left behind: the bench's stack
runs on a database of its own, dropped at the end (deleting two million
rows one by one first would only add minutes)."""

from __future__ import annotations

import io
import json
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.lib import Api, log

TARGET_MS = 20.0
TARGET_QUERIES = 5
TARGET_SEED_S = 120.0
SLUG = "bench-runs-list"
PAGE = 50
BATCH = 100_000
WORKFLOWS = [f"train-{n}" for n in range(20)]
STATUSES = ["succeeded"] * 16 + ["failed"] * 2 + ["stopped", "running"]
ADJECTIVES = ["brave", "calm", "eager", "fuzzy", "gentle", "happy", "jolly", "keen", "lucky", "merry"]
ANIMALS = ["otter", "panda", "lynx", "heron", "koala", "bison", "crane", "gecko", "moose", "tapir"]


def bench_runs_list(api: Api, database_url: str, runs: int, samples: int) -> dict[str, Any]:
    """Seed, then measure each case (the stack drops its database afterwards)."""
    _django(database_url)
    from django.db import connection

    from backend.accounts.models import Membership, Role, User, Workspace

    user = User.objects.get(username="bench")
    workspace = Workspace.objects.create(slug=SLUG, name="Bench runs list")
    Membership.objects.create(workspace=workspace, user=user, role=Role.ADMIN)
    started = time.monotonic()
    _seed(connection, workspace.pk, user.pk, runs)
    seed_s = round(time.monotonic() - started, 1)
    log(f"(6) runs list: {runs:,} runs + jobs seeded by COPY in {seed_s} s (with VACUUM and ANALYZE)")
    result: dict[str, Any] = {"runs": runs, "seed_seconds": seed_s, "cases": {}, "trigram": _has_trigram(connection)}
    for name, query in _cases(connection, workspace.pk, runs).items():
        result["cases"][name] = _measure(api, query, samples)
        log(f"(6) runs list, {name}: {result['cases'][name]}")
    result["count_shown"] = api.get(f"/api/v1/workspaces/{SLUG}/runs/")["count"]
    return result


def _has_trigram(connection: Any) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'run_name_trgm'")
        return cursor.fetchone() is not None


def _django(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backend.config.settings")
    import django

    django.setup()


def _cases(connection: Any, workspace_id: uuid.UUID, runs: int) -> dict[str, str]:
    """The four cases, as query strings; page 1,000's cursor is the position
    of row 49,950 (what 999 `next` links would have led to; with fewer runs
    seeded, the last page's)."""
    from backend.core.cursors import Position, cursor_encode

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT created_at, id FROM runs_run WHERE workspace_id = %s ORDER BY created_at DESC, id DESC"
            " OFFSET %s LIMIT 1",
            [workspace_id, min(PAGE * 999, runs - PAGE) - 1],
        )
        created_at, ident = cursor.fetchone()
    cursor_1000 = cursor_encode(Position(created_at, ident))
    return {
        "first page": "",
        "page 1,000 (cursor)": f"cursor={cursor_1000}",
        "filter (status=failed)": "status=failed",
        "search (q=otter-420)": "q=otter-420",
    }


def _measure(api: Api, query: str, samples: int) -> dict[str, Any]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    path = f"/api/v1/workspaces/{SLUG}/runs/?page_size={PAGE}" + (f"&{query}" if query else "")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api.token}")
    with CaptureQueriesContext(connection) as queries:
        body = json.loads(client.get(path).content)
    for _ in range(2):  # warm the web process's connection and caches
        api.get(path)
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        api.get(path)
        times.append((time.perf_counter() - started) * 1000)
    return {
        "p50_ms": round(statistics.median(times), 1),
        "max_ms": round(max(times), 1),
        "queries": len(queries),
        "rows": len(body["results"]),
        "count": body["count"],
        "count_estimated": body["count_estimated"],
    }


def _seed(connection: Any, workspace_id: uuid.UUID, user_id: int, runs: int) -> None:
    """Runs and their jobs by COPY in batches, created one second apart
    (newest last), then VACUUM and ANALYZE so the planner sees them. The tables'
    secondary indexes are dropped for the COPY and made again after it,
    before anything is measured: building an index once from sorted rows is
    cheaper than inserting a million random keys into it one at a time (the
    primary keys and unique constraints stay, and are checked row by row)."""
    start = datetime.now(UTC) - timedelta(seconds=runs)
    raw = connection.connection  # psycopg's own connection: its COPY
    with raw.cursor() as cursor:
        indexes = _drop_secondary_indexes(cursor, ("runs_run", "runs_job"))
        for first in range(0, runs, BATCH):
            numbers = range(first, min(first + BATCH, runs))
            ids = [uuid.uuid4() for _ in numbers]
            _copy(cursor, "runs_run", _RUN_COLUMNS, _run_rows(numbers, ids, start, workspace_id, user_id))
            _copy(cursor, "runs_job", _JOB_COLUMNS, _job_rows(numbers, ids, start, workspace_id))
        cursor.execute("SET maintenance_work_mem = '256MB'")
        for definition in indexes:
            cursor.execute(definition)
        cursor.execute("RESET maintenance_work_mem")
        # VACUUM too: autovacuum would otherwise start on two million new rows
        # while the pages are timed (on 2 cores: a core of the measurement).
        cursor.execute("VACUUM (ANALYZE) runs_run")
        cursor.execute("VACUUM (ANALYZE) runs_job")


def _drop_secondary_indexes(cursor: Any, tables: tuple[str, ...]) -> list[str]:
    """Drop the indexes of ``tables`` that no constraint owns; return their definitions."""
    cursor.execute(
        "SELECT x.indexrelid::regclass::text, pg_get_indexdef(x.indexrelid) FROM pg_index x"
        " WHERE x.indrelid::regclass::text = ANY(%s)"
        " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)",
        [list(tables)],
    )
    found = cursor.fetchall()
    for name, _ in found:
        cursor.execute(f"DROP INDEX {name}")
    return [definition for _, definition in found]


_RUN_COLUMNS = (
    "id, created_at, updated_at, workspace_id, name, workflow, status, status_reason, submitted_by_id, code_kind,"
    " repo_url, commit, help, workflows_file_path, workflows_file_text, workflows_files, env_overrides,"
    " inherited_env, run_args, variables, placement_overrides, no_cache, started_at, finished_at"
)
_JOB_COLUMNS = (
    "id, created_at, updated_at, workspace_id, run_id, name, workflow, spec, gpu_count, gpu_name, status,"
    " status_reason, attempt, retry_policy, placement, placement_note, stop_reason, last_seq, log_bytes, log_note,"
    " ports, input_refs, cache_key"
)


def _run_rows(
    numbers: range, ids: list[uuid.UUID], start: datetime, workspace_id: uuid.UUID, user_id: int
) -> Iterator[str]:
    for n, ident in zip(numbers, ids, strict=True):
        at = (start + timedelta(seconds=n)).isoformat()
        name = f"{ADJECTIVES[n % 10]}-{ANIMALS[n // 10 % 10]}-{n}"
        workflow, status = WORKFLOWS[n % 20], STATUSES[n % 20 if n % 7 else (n // 7) % 20]
        yield (
            f"{ident}\t{at}\t{at}\t{workspace_id}\t{name}\t{workflow}\t{status}\t\t{user_id}\tgit\t"
            f"https://example.com/acme/models.git\t{'a' * 40}\t\t.trainyard/workflows.yaml\tworkflows: []\t"
            f"[]\t{{}}\t{{}}\t[]\t{{}}\t{{}}\tf\t{at}\t{at}\n"
        )


def _job_rows(numbers: range, ids: list[uuid.UUID], start: datetime, workspace_id: uuid.UUID) -> Iterator[str]:
    spec = json.dumps({"provider": "bash", "commands": ["python train.py"]})
    for n, run_id in zip(numbers, ids, strict=True):
        at = (start + timedelta(seconds=n)).isoformat()
        yield (
            f"{uuid.uuid4()}\t{at}\t{at}\t{workspace_id}\t{run_id}\tmain\t{WORKFLOWS[n % 20]}\t{spec}\t0\t\t"
            f"succeeded\t\t1\t{{}}\t{{}}\t\t\t100\t4000\t\t[]\t[]\t\n"
        )


def _copy(cursor: Any, table: str, columns: str, rows: Iterator[str]) -> None:
    text = io.StringIO("".join(rows))
    with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        while chunk := text.read(1 << 20):
            copy.write(chunk)

"""(7) Cost rollups at scale: a workspace seeded by COPY with 1,000,000
attempts in one calendar month (50,000 runs of 20 submitters and 20
workflows, 20 attempts each, on 100,000 machines, the last 1,000 attempts
still running on live machines), the rollup backfilled as its migration
does, then the month's cost by user and by workflow — the selector in this
process and the API over HTTP — against the target, beside a baseline
taken in the same run: the plain SQL aggregate that computes every
attempt's cost from its row (what an index alone can give). The rollup's
answer is checked equal to the row-by-row definition once. Then what the
triggers add to an attempt's end (the hot path). The stack's database is
dropped at the end."""

from __future__ import annotations

import io
import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from bench.lib import Api, log
from bench.runs_list import _django

TARGET_MS = 50.0
SLUG = "bench-cost-rollup"
USERS = 20
WORKFLOWS = [f"train-{n}" for n in range(20)]
PER_JOB = 20
PER_MACHINE = 10
OPEN = 1_000
BATCH = 200_000
BASELINE_SAMPLES = 3


def bench_cost_rollup(api: Api, database_url: str, attempts: int, samples: int) -> dict[str, Any]:
    _django(database_url)
    from django.db import connection

    from backend.accounts.models import Membership, Role, User, Workspace

    bench_user = User.objects.get(username="bench")
    workspace = Workspace.objects.create(slug=SLUG, name="Bench cost rollup")
    Membership.objects.create(workspace=workspace, user=bench_user, role=Role.ADMIN)
    users = [User.objects.create(username=f"spender-{n}").pk for n in range(USERS)]
    # The previous calendar month, whole; "now" is its last hour.
    this_month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    month = (this_month - timedelta(days=1)).replace(day=1)
    now = this_month - timedelta(minutes=30)
    result: dict[str, Any] = {"attempts": attempts, "month": month.strftime("%Y-%m"), "cases": {}}

    started = time.monotonic()
    _seed(connection, workspace.pk, users, month, now, attempts)
    result["seed_seconds"] = round(time.monotonic() - started, 1)
    log(f"(7) cost rollup: {attempts:,} attempts seeded by COPY in {result['seed_seconds']} s")
    from backend.billing import rollup

    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(rollup.REBUILD)
        cursor.execute("VACUUM (ANALYZE) billing_costday")
        cursor.execute("VACUUM (ANALYZE) billing_machineidle")
        cursor.execute("SELECT count(*) FROM billing_costday")
        result["rollup_rows"] = cursor.fetchone()[0]
    result["backfill_seconds"] = round(time.monotonic() - started, 1)
    log(f"(7) cost rollup: backfilled {result['rollup_rows']:,} rows in {result['backfill_seconds']} s")

    from backend.billing.selectors import cost_report, month_spend

    for by in ("user", "workflow"):
        result["cases"][f"month by {by} (selector)"] = _timed(
            lambda by=by: cost_report(workspace=workspace, since=month, until=now, by=by, now=now), samples
        )
        path = f"/api/v1/workspaces/{SLUG}/costs/?by={by}&since={month.isoformat()}&until={now.isoformat()}"
        result["cases"][f"month by {by} (API)"] = _timed(lambda path=path: api.get(path.replace("+", "%2B")), samples)
        result["cases"][f"month by {by}, baseline: SQL aggregate of the rows"] = _timed(
            lambda by=by: _aggregate(connection, workspace.pk, month, now, by), BASELINE_SAMPLES
        )
    result["cases"]["last 30 days by user"] = _timed(
        lambda: cost_report(workspace=workspace, since=now - timedelta(days=30), until=now, by="user", now=now),
        samples,
    )
    # A window that starts inside a day that has attempts before and after: that day's rows are read.
    midday = month + timedelta(days=9, hours=12)
    result["cases"]["from the 10th, 12:00 UTC, by user (info: the cut day's ~33,000 rows read)"] = _timed(
        lambda: cost_report(workspace=workspace, since=midday, until=now, by="user", now=now), samples
    )
    result["cases"]["month_spend (the budgets' read)"] = _timed(
        lambda: month_spend(workspace_ids=[workspace.pk], now=now), samples
    )
    for name, case in result["cases"].items():
        log(f"(7) cost rollup, {name}: {case}")

    # The rollup's answer, against the definition computed row by row (once: it takes a while).
    from backend.billing.rowwise import report_sums

    started = time.monotonic()
    sums, idle = report_sums(workspace=workspace, since=month, until=now, by="user", now=now)
    report = cost_report(workspace=workspace, since=month, until=now, by="user", now=now)
    result["rowwise_seconds"] = round(time.monotonic() - started, 1)
    result["equal_to_rowwise"] = {r.key: r.cost for r in report.rows} == sums and report.idle == idle
    result["aggregate_equal"] = _aggregate(connection, workspace.pk, month, now, "user") == sums
    result["total"] = str(report.total)
    log(f"(7) cost rollup: equal to the row-by-row computation: {result['equal_to_rowwise']} (total {report.total})")
    result["hot_path"] = _hot_path(connection, workspace.pk, now)
    log(f"(7) cost rollup, an attempt's end: {result['hot_path']}")
    return result


def _timed(call: Any, samples: int) -> dict[str, float]:
    call()  # warm
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1), "samples": samples}


def _aggregate(connection: Any, workspace_id: uuid.UUID, since: datetime, until: datetime, by: str) -> dict[str, Any]:
    """Every attempt of the window costed from its row in SQL, grouped: the
    settled and the open alike, nothing kept in advance."""
    key = {"user": "u.username", "workflow": "r.workflow"}[by]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {key}, sum(billing_cost(m.price_per_hour,"
            "   billing_held_seconds(a.started_at, a.finished_at, m.terminated_at, %s)))"
            " FROM runs_attempt a JOIN clouds_instance m ON m.id = a.instance_id"
            " JOIN runs_job j ON j.id = a.job_id JOIN runs_run r ON r.id = j.run_id"
            " LEFT JOIN accounts_user u ON u.id = r.submitted_by_id"
            " WHERE a.workspace_id = %s AND a.started_at >= %s AND a.started_at < %s GROUP BY 1",
            [until, workspace_id, since, until],
        )
        return {name: Decimal(cost) for name, cost in cursor.fetchall()}


def _hot_path(connection: Any, workspace_id: uuid.UUID, now: datetime) -> dict[str, float]:
    """Ending an open attempt (one UPDATE, its own transaction), with the
    triggers and, on other attempts, without them: the mean ms of each."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM runs_attempt WHERE workspace_id = %s AND finished_at IS NULL ORDER BY started_at LIMIT 400",
            [workspace_id],
        )
        ids = [row[0] for row in cursor.fetchall()]
    timings: dict[str, float] = {}
    for name, chunk in (("without triggers", ids[:200]), ("with triggers", ids[200:])):
        if name == "without triggers":
            connection.cursor().execute("ALTER TABLE runs_attempt DISABLE TRIGGER USER")
        times = []
        for pk in chunk:
            started = time.perf_counter()
            with connection.cursor() as cursor:
                cursor.execute("UPDATE runs_attempt SET finished_at = %s WHERE id = %s", [now, pk])
            times.append((time.perf_counter() - started) * 1000)
        if name == "without triggers":
            connection.cursor().execute("ALTER TABLE runs_attempt ENABLE TRIGGER USER")
        timings[f"{name}_ms"] = round(statistics.mean(times), 3) if times else 0.0
    return timings


def _seed(
    connection: Any, workspace_id: uuid.UUID, users: list[int], month: datetime, now: datetime, attempts: int
) -> None:
    """Runs, jobs, machines and attempts by COPY, the triggers off (the
    backfill settles them after), secondary indexes made after the rows.
    Attempt k starts at an even spacing through the month and runs 10-60
    minutes; machine k // 10 runs from its first attempt's start - 30 s to
    its last one's end + 60 s; the last ``OPEN`` attempts are still open, on
    machines still running at ``now``."""
    jobs = attempts // PER_JOB
    machines = attempts // PER_MACHINE
    step = (now - timedelta(hours=2) - month) / attempts
    raw = connection.connection
    tables = ("runs_run", "runs_job", "runs_attempt", "clouds_instance")
    with raw.cursor() as cursor:
        for table in tables:
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        indexes = _drop_secondary_indexes(cursor, tables)
        run_ids = [uuid.uuid4() for _ in range(jobs)]
        job_ids = [uuid.uuid4() for _ in range(jobs)]
        machine_ids = [uuid.uuid4() for _ in range(machines)]
        at = month.isoformat()
        _copy(cursor, "runs_run", _rows_for(cursor, "runs_run", (
            {"id": run_ids[n], "created_at": at, "updated_at": at, "workspace_id": workspace_id,
             "name": f"cost-{n}", "workflow": WORKFLOWS[n // USERS % len(WORKFLOWS)], "status": "succeeded",
             "submitted_by_id": users[n % USERS], "code_kind": "git"}
            for n in range(jobs)
        )))  # fmt: skip
        _copy(cursor, "runs_job", _rows_for(cursor, "runs_job", (
            {"id": job_ids[n], "created_at": at, "updated_at": at, "workspace_id": workspace_id,
             "run_id": run_ids[n], "name": "main", "workflow": WORKFLOWS[n // USERS % len(WORKFLOWS)],
             "status": "succeeded", "attempt": PER_JOB}
            for n in range(jobs)
        )))  # fmt: skip

        def start(k: int) -> datetime:
            return month + step * k

        def end(k: int) -> datetime | None:
            return None if k >= attempts - OPEN else start(k) + timedelta(seconds=600 + (k * 7919) % 3000)

        def machine(i: int) -> dict[str, Any]:
            first, last = i * PER_MACHINE, i * PER_MACHINE + PER_MACHINE - 1
            live = end(last) is None
            return {
                "id": machine_ids[i], "created_at": at, "updated_at": at, "workspace_id": workspace_id,
                "backend": "aws" if i % 3 else "local", "name": f"m-{i}", "token_hash": machine_ids[i].hex,
                "status": "busy" if live else "terminated",
                "price_per_hour": "0" if i % 3 == 0 else f"{0.5 + (i * 37 % 400) / 100:.6f}",
                "running_at": (start(first) - timedelta(seconds=30)).isoformat(),
                "last_heartbeat_at": datetime.now(UTC).isoformat() if live else None,
                "terminated_at": None if live else (end(last) + timedelta(seconds=60)).isoformat(),  # type: ignore[operator]
            }  # fmt: skip

        for first in range(0, machines, BATCH):
            _copy(cursor, "clouds_instance", _rows_for(cursor, "clouds_instance", (
                machine(i) for i in range(first, min(first + BATCH, machines)))))  # fmt: skip
        for first in range(0, attempts, BATCH):
            _copy(cursor, "runs_attempt", _rows_for(cursor, "runs_attempt", (
                {"id": uuid.uuid4(), "created_at": at, "updated_at": at, "workspace_id": workspace_id,
                 "job_id": job_ids[k % jobs], "number": k // jobs + 1, "instance_id": machine_ids[k // PER_MACHINE],
                 "status": "running" if end(k) is None else "ended", "started_at": start(k).isoformat(),
                 "finished_at": None if end(k) is None else end(k).isoformat()}  # type: ignore[union-attr]
                for k in range(first, min(first + BATCH, attempts))
            )))  # fmt: skip
        cursor.execute("SET maintenance_work_mem = '256MB'")
        for definition in indexes:
            cursor.execute(definition)
        cursor.execute("RESET maintenance_work_mem")
        for table in tables:
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
            cursor.execute(f"VACUUM (ANALYZE) {table}")


_FILL = {"boolean": "f", "integer": "0", "bigint": "0", "smallint": "0", "numeric": "0"}


_LISTS = {"offers_tried", "gpus", "data_cached", "workflows_files", "run_args", "ports", "input_refs"}


def _rows_for(cursor: Any, table: str, rows: Iterator[dict[str, Any]]) -> tuple[list[str], Iterator[str]]:
    """COPY text lines for ``rows``: the given columns, and every other NOT NULL
    column without a database default filled with its type's zero (so the
    bench keeps working when a model gains a column)."""
    cursor.execute(
        "SELECT column_name, data_type, is_nullable = 'NO' AND column_default IS NULL"
        " FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        [table],
    )
    found = cursor.fetchall()
    first = next(rows)
    columns = [(name, kind) for name, kind, required in found if required or name in first]

    def zero(name: str, kind: str) -> str:
        if kind == "jsonb":
            return "[]" if name in _LISTS else "{}"
        if kind.startswith("timestamp"):
            return "1970-01-01T00:00:00+00:00"
        return _FILL.get(kind) or ""

    def lines() -> Iterator[str]:
        for row in (first, *rows):
            values = [row[name] if name in row else zero(name, kind) for name, kind in columns]
            yield "\t".join("\\N" if value is None else str(value) for value in values) + "\n"

    return [name for name, _ in columns], lines()


def _copy(cursor: Any, table: str, spec: tuple[list[str], Iterator[str]]) -> None:
    columns, lines = spec
    text = io.StringIO("".join(lines))
    with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        while chunk := text.read(1 << 20):
            copy.write(chunk)


def _drop_secondary_indexes(cursor: Any, tables: tuple[str, ...]) -> list[str]:
    from bench.runs_list import _drop_secondary_indexes as drop

    return drop(cursor, tables)

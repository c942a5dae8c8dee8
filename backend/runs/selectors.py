"""Reads for runs, jobs and logs. Every selector requires ``workspace``."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.postgres.expressions import ArraySubquery
from django.db import connection
from django.db.models import (
    Count,
    Exists,
    IntegerField,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    TextField,
)
from django.db.models.functions import Cast, Coalesce, JSONObject

from backend.accounts.models import User, Workspace
from backend.artifacts.models import Artifact, ArtifactStatus, CheckpointLatest
from backend.clouds.models import Instance
from backend.core.cursors import Position, cursor_decode, cursor_encode
from backend.data.models import DataSnapshot
from backend.runs.lifecycle.dag import ref_origin
from backend.runs.models import Attempt, Environment, EnvironmentArchive, Job, Run, Tag, runs_named
from backend.runs.services.logchunks import LAST_SEQ, chunks_forward, clipped


def run_list(
    *,
    workspace: Workspace,
    status: str = "",
    workflow: str = "",
    q: str = "",
    tag: str = "",
    submitted_by: User | None = None,
) -> QuerySet[Run]:
    """The workspace's runs matching the filters, newest first (``-created_at, -id``:
    the order of the ``run_ws_*`` indexes); ``run_page`` reads a page of them.
    ``status``: comma-separated statuses; ``submitted_by``: only that person's runs."""
    runs = Run.objects.for_workspace(workspace).order_by("-created_at", "-id")
    if submitted_by is not None:
        runs = runs.filter(submitted_by=submitted_by)
    if status:
        runs = runs.filter(status__in=status.split(","))
    if workflow:
        runs = runs.filter(workflow=workflow)
    if q:
        runs = runs.filter(_search(q))
    if tag:
        runs = runs.filter(tags__name=tag)
    return runs


def with_shown(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` with everything ``RunOut`` reads fetched in two queries: the
    runs with their tags as an array column, then their jobs with the DAG
    edges and the attempts (``job_attempts``) as array columns. The
    workflows files and the submission's inputs are not read: nothing shown
    needs them, and they are the run's largest columns."""
    attempts = Attempt.objects.filter(job=OuterRef("pk")).order_by("number")
    needs = Job.needs.through.objects.filter(from_job=OuterRef("pk")).order_by("to_job__name")
    after = Job.after_running.through.objects.filter(from_job=OuterRef("pk")).order_by("to_job__name")
    jobs = Job.objects.select_related("instance", "cached_from__run").annotate(
        need_names=ArraySubquery(needs.values("to_job__name")),
        # What ``job_extras`` reads a needed job's artifacts from: its cache source, else itself.
        need_sources=ArraySubquery(needs.values(source=Coalesce("to_job__cached_from_id", "to_job_id"))),
        after_names=ArraySubquery(after.values("to_job__name")),
        attempt_rows=ArraySubquery(attempts.values(row=JSONObject(**_ATTEMPT_SHOWN))),
    )
    tags = Tag.objects.filter(run=OuterRef("pk")).order_by("name").values("name")
    return (
        runs.defer(*_UNSHOWN_RUN_FIELDS)
        .annotate(tag_names=ArraySubquery(tags))
        .prefetch_related(Prefetch("jobs", queryset=jobs.order_by("created_at", "id")))
    )


def job_attempts(job: Job) -> list[Attempt]:
    """The job's attempts, oldest first, with their instances (unsaved: for
    showing only): from ``with_shown``'s array column, else a query."""
    shown = getattr(job, "_attempts_shown", None)
    if shown is None:
        rows = getattr(job, "attempt_rows", None)
        if rows is None:
            shown = list(job.attempts.select_related("instance").order_by("number"))
        else:
            shown = [_attempt_of(row) for row in rows]
        job._attempts_shown = shown  # type: ignore[attr-defined]
    return list(shown)


# What AttemptOut shows of an attempt and its instance, as one JSON object per attempt.
_ATTEMPT_SHOWN = {
    **{f: f for f in ("number", "status", "termination_reason", "termination_message", "exit_code")},
    **{f: f for f in ("started_at", "finished_at", "first_seq", "last_seq", "offers_tried")},
    **{f: f for f in ("restored_checkpoint", "environment_key", "created_at", "instance_id")},
    **{f"instance_{f}": f"instance__{f}" for f in ("name", "backend", "instance_type", "region", "zone", "spot")},
    **{f"instance_{f}": f"instance__{f}" for f in ("running_at", "terminated_at")},
    # As text: a JSON number would come back a float, and money is exact.
    "instance_price_per_hour": Cast("instance__price_per_hour", output_field=TextField()),
}
_DATES = ("started_at", "finished_at", "created_at")
_INSTANCE_DATES = ("running_at", "terminated_at")


def _attempt_of(row: dict[str, Any]) -> Attempt:
    values = {k: v for k, v in row.items() if not k.startswith("instance_")}
    for name in _DATES:
        values[name] = datetime.fromisoformat(values[name]) if values[name] else None
    attempt = Attempt(**values)
    if row["instance_id"]:
        fields = {
            k.removeprefix("instance_"): v for k, v in row.items() if k.startswith("instance_") and k != "instance_id"
        }
        for name in _INSTANCE_DATES:
            fields[name] = datetime.fromisoformat(fields[name]) if fields[name] else None
        fields["price_per_hour"] = Decimal(fields["price_per_hour"] or 0)
        attempt.instance = Instance(id=row["instance_id"], **fields)
    return attempt


_UNSHOWN_RUN_FIELDS = (
    "workflows_file_text",
    "workflows_files",
    "env_overrides",
    "inherited_env",
    "run_args",
    "variables",
    "placement_overrides",
    "patch_files",
)


@dataclass(frozen=True)
class RunPage:
    rows: list[RunRow]  # newest first
    next: str | None  # the cursor of the page after this one (None: the last page)
    count: int
    count_estimated: bool  # ``count`` is the planner's estimate (above RUNS_EXACT_COUNT_UP_TO)


# A run of a page as ``run_page`` reads it: by column name, the run's shown
# columns, ``submitter`` (a username or None), ``tag_names`` and ``jobs``,
# each job a dict of its shown columns with ``instance_name``,
# ``cached_from_run``, ``need_names``, ``after_names``, ``need_inputs``
# ([path, job name]), ``ref_inputs`` ([ref number from 1, path]),
# ``checkpoint_path``, ``checkpoint_latest`` and ``attempts`` (dicts, their
# instance's fields prefixed ``instance_``); dates as aware datetimes.
RunRow = dict[str, Any]


def run_page(*, runs: QuerySet[Run], cursor: str, size: int) -> RunPage:
    """One keyset page of ``runs`` (``run_list``, ordered ``-created_at, -id``)
    after ``cursor`` ("": the first page). A page costs the same at page 1 and
    page 10,000: it starts from an index position, not an OFFSET.

    1. One query (``_PAGE_SQL``): ``size + 1`` runs after the cursor (the
       extra one says a next page exists), each with its tags and its jobs
       (DAG edges, attempts, inputs, checkpoint), and the matches counted up
       to the cap + 1 (``RUNS_EXACT_COUNT_UP_TO``). A first page reads both
       from the same rows, so a search's filter is evaluated once.
    2. The total: a first page that is not full counts itself; under the cap
       the count is exact; over it, the planner's estimate (``_count``).
    """
    cap = settings.TRAINYARD["RUNS_EXACT_COUNT_UP_TO"]
    if cursor:
        at = cursor_decode(cursor)
        # (created_at, id) < the cursor's, spelled so an index bounds it: the
        # redundant ``created_at <=`` is the index condition (the OR alone is a
        # filter, and page 1,000 would read the 49,950 rows before it).
        after = runs.filter(created_at__lte=at.created_at).filter(
            Q(created_at__lt=at.created_at) | Q(created_at=at.created_at, id__lt=at.id)
        )
        rows = _page_rows(after.values("id", "created_at")[: size + 1], size, counted=runs.values("id")[: cap + 1])
    else:
        rows = _page_rows(runs.values("id", "created_at")[: max(size, cap) + 1], size, counted=None)
    more = len(rows) > size
    capped = rows[0]["counted"] if rows else runs.values("id")[: cap + 1].count()
    rows = rows[:size]
    after_last = cursor_encode(Position(rows[-1]["created_at"], rows[-1]["id"])) if more else None
    count, estimated = (len(rows), False) if not cursor and not more else _count(runs, capped, cap)
    return RunPage(rows, after_last, count, estimated)


def run_row(*, runs: QuerySet[Run], detail: bool = False) -> RunRow | None:
    """The newest run of ``runs`` (one, in practice: a run by id or name) as
    ``run_page`` reads it, in one query: what the run page, its followers and
    the published snapshots show, without a prefetch or a model per row.
    ``detail``: each job also holds its spec's ``data`` and ``volumes`` items
    (``job_data`` shows them; a page of the list does not read them)."""
    rows = _page_rows(runs.values("id", "created_at")[:1], 1, counted=None, detail=detail)
    return rows[0] if rows else None


# The page's runs with their tags and their jobs, each job one JSON object of
# what JobOut shows: Postgres builds them (an index probe per job and per
# edge), so Python neither compiles a prefetch nor builds a model per row.
# ``{matches}`` is the ORM's query of the runs to show (ids, newest first;
# materialised, so it is read once for the page and its count), ``{counted}``
# the count of matches up to the cap + 1. A cached job's inputs are its
# source's artifacts, as ``job_extras`` reads them (outputs, complete); the
# ref arm's one-time filter skips it for a job without refs.
_PAGE_SQL = """
WITH matches AS MATERIALIZED ({matches})
SELECT r.id, r.workspace_id, r.name, r.workflow, r.help, r.status, r.status_reason, r.exit_code,
  r.created_at, r.started_at, r.finished_at, r.no_cache, r.environment_build, r.max_cost, r.budget_override,
  r.code_kind, r.repo_url,
  r."commit", r.patch_blob_id, r.rerun_of_id, u.username AS submitter, ({counted}) AS counted,
  ARRAY(SELECT t.name FROM runs_tag t WHERE t.run_id = r.id) AS tag_names,
  (SELECT json_agg(j_shown ORDER BY j_shown.created_at, j_shown.id)::text FROM (
    SELECT j.id, j.created_at, j.name, j.workflow, j.status, j.status_reason, j.exit_code, j.attempt,
      j.ports, j.cpu, j.memory_bytes, j.gpu_count, j.gpu_name, j.cached_from_id, j.cache_decision,
      j.placement, j.on_demand_since, j.placement_note, j.started_at, j.finished_at, j.last_seq,
      j.log_bytes, j.log_note, j.input_refs,
      COALESCE(j.spec -> 'provider', '"bash"') AS provider, j.spec -> 'checkpoint' AS checkpoint_path,
      j.spec -> 'dev_environment' AS dev_environment,{detail}
      i.name AS instance_name, cr.name AS cached_from_run,
      ARRAY(SELECT n.name FROM runs_job_needs e JOIN runs_job n ON n.id = e.to_job_id
            WHERE e.from_job_id = j.id) AS need_names,
      ARRAY(SELECT n.name FROM runs_job_after_running e JOIN runs_job n ON n.id = e.to_job_id
            WHERE e.from_job_id = j.id) AS after_names,
      ARRAY(SELECT json_build_array(a.path, n.name) FROM runs_job_needs e JOIN runs_job n ON n.id = e.to_job_id
              JOIN artifacts_artifact a ON a.job_id = COALESCE(n.cached_from_id, n.id)
            WHERE e.from_job_id = j.id AND a.kind = 'output' AND a.status = 'complete'
            ORDER BY n.name, a.path) AS need_inputs,
      ARRAY(SELECT json_build_array(ref.number, a.path)
            FROM jsonb_array_elements(j.input_refs) WITH ORDINALITY AS ref(value, number)
              JOIN runs_job rj ON rj.run_id = (ref.value ->> 'run_id')::uuid
              JOIN artifacts_artifact a ON a.job_id = COALESCE(rj.cached_from_id, rj.id)
            WHERE j.input_refs <> '[]' AND a.kind = 'output' AND a.status = 'complete') AS ref_inputs,
      (SELECT json_build_object('number', v.number, 'attempt', v.attempt, 'size', v.total_size,
                'files', (SELECT count(*) FROM artifacts_artifactfile f WHERE f.artifact_id = v.id),
                'completed_at', v.completed_at)
         FROM artifacts_checkpointlatest cl JOIN artifacts_artifact v ON v.id = cl.version_id
        WHERE cl.job_id = j.id) AS checkpoint_latest,
      (SELECT json_agg(a_shown ORDER BY a_shown.number) FROM (
         SELECT a.number, a.status, a.termination_reason, a.termination_message, a.exit_code, a.started_at,
           a.finished_at, a.first_seq, a.last_seq, a.offers_tried, a.restored_checkpoint, a.environment_key,
           a.created_at, ai.name AS instance_name, ai.backend AS instance_backend,
           ai.instance_type AS instance_instance_type, ai.region AS instance_region,
           ai.zone AS instance_zone, ai.spot AS instance_spot, ai.price_per_hour::text AS instance_price_per_hour,
           ai.running_at AS instance_running_at, ai.terminated_at AS instance_terminated_at
         FROM runs_attempt a LEFT JOIN clouds_instance ai ON ai.id = a.instance_id
         WHERE a.job_id = j.id) a_shown) AS attempts
    FROM runs_job j
      LEFT JOIN clouds_instance i ON i.id = j.instance_id
      LEFT JOIN runs_job cj ON cj.id = j.cached_from_id
      LEFT JOIN runs_run cr ON cr.id = cj.run_id
    WHERE j.run_id = r.id) j_shown) AS jobs
FROM (SELECT id, created_at FROM matches ORDER BY created_at DESC, id DESC LIMIT {size}) page
  JOIN runs_run r ON r.id = page.id
  LEFT JOIN accounts_user u ON u.id = r.submitted_by_id
ORDER BY page.created_at DESC, page.id DESC
"""
# What only one run's page reads of each job (``run_row(detail=True)``).
_DETAIL_SQL = """
      COALESCE(j.spec -> 'data', '[]') AS data, COALESCE(j.spec -> 'volumes', '[]') AS volumes,"""
_JOB_DATES = ("created_at", "on_demand_since", "started_at", "finished_at")
_ATTEMPT_DATES = ("created_at", "started_at", "finished_at", "instance_running_at", "instance_terminated_at")


def _page_rows(
    matches: QuerySet[Any], size: int, *, counted: QuerySet[Any] | None, detail: bool = False
) -> list[RunRow]:
    """The first ``size + 1`` of ``matches`` (ids and creation times, newest
    first) as ``RunRow``s, each also holding ``counted``: how many rows the
    bounded query ``counted`` has (None: ``matches`` has)."""
    matches_sql, params = matches.query.sql_with_params()
    counted_sql, counted_params = "SELECT count(*) FROM matches", ()
    if counted is not None:
        inner, counted_params = counted.query.sql_with_params()
        counted_sql = f"SELECT count(*) FROM ({inner}) counted"
    sql = _PAGE_SQL.format(
        matches=matches_sql, counted=counted_sql, size=int(size) + 1, detail=_DETAIL_SQL if detail else ""
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, (*params, *counted_params))
        names = [column.name for column in cursor.description]
        rows = [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
    for row in rows:
        row["jobs"] = [_job_row(job) for job in json.loads(row["jobs"] or "[]")]
    return rows


def _job_row(job: dict[str, Any]) -> dict[str, Any]:
    """A job of ``_PAGE_SQL`` as Python reads its models: dates as datetimes."""
    for name in _JOB_DATES:
        job[name] = _date(job[name])
    job["attempts"] = job["attempts"] or []
    for attempt in job["attempts"]:
        for name in _ATTEMPT_DATES:
            attempt[name] = _date(attempt[name])
    if job["checkpoint_latest"] is not None:
        job["checkpoint_latest"]["completed_at"] = _date(job["checkpoint_latest"]["completed_at"])
    return job


def _date(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _search(q: str) -> Q:
    """Name, workflow or submitter contains ``q`` (any case). The name and
    workflow use trigram indexes (``run_name_trgm``, ``run_workflow_trgm``);
    the submitters are looked up first, so the three arms combine as one
    bitmap OR on indexes instead of a scan of the workspace's runs (as a
    subquery, the planner could not tell how many runs they submitted)."""
    users = list(User.objects.filter(username__icontains=q).values_list("pk", flat=True)[:1000])
    return Q(name__icontains=q) | Q(workflow__icontains=q) | Q(submitted_by_id__in=users)


def _count(runs: QuerySet[Run], capped: int, cap: int) -> tuple[int, bool]:
    """The total of ``runs``, of which ``capped`` were counted (at most cap +
    1): exact up to the cap, so a small workspace is exact even when the
    statistics are stale; above it the planner's row estimate (planning
    only: no row is read), which far above the cap (10×) is the answer: an
    exact count there would read every match. In between, the larger of the two.
    """
    if capped <= cap:
        return capped, False
    plain = runs.order_by().values("pk")
    estimate = int(json.loads(plain.explain(format="json"))[0]["Plan"]["Plan Rows"])
    if estimate > 10 * cap:
        return estimate, True
    return max(estimate, capped), True


@dataclass(frozen=True)
class JobExtras:
    """What ``JobOut`` shows beyond the job's own rows, for many jobs at once."""

    inputs: dict[uuid.UUID, list[tuple[str, str]]]  # job id -> [(artifact path, origin)]
    checkpoints: dict[uuid.UUID, CheckpointLatest]  # job id -> pointer (version, version_files)


def job_extras(*, jobs: list[Job]) -> JobExtras:
    """Inputs and latest checkpoints of ``jobs`` (needs prefetched, as
    ``with_shown`` does) in three queries, however many jobs and runs.

    1. The runs named by ``deps: - tag/run``: their jobs' sources.
    2. The complete artifacts of every source (a cached job's: its source's).
    3. The latest checkpoint versions, with their file counts.
    """
    by_job = {j.pk: _sources(j) for j in jobs}
    ref_runs = {ref["run_id"] for j in jobs for ref in j.input_refs}
    run_sources: dict[str, list[uuid.UUID]] = {}
    if ref_runs:
        for run_id, pk, cached in Job.objects.filter(run_id__in=ref_runs).values_list("run_id", "pk", "cached_from_id"):
            run_sources.setdefault(str(run_id), []).append(cached or pk)
    wanted = {s for pairs in by_job.values() for s, _ in pairs} | {s for v in run_sources.values() for s in v}
    found: dict[uuid.UUID, list[Artifact]] = {}
    if wanted:
        complete = Artifact.objects.filter(job_id__in=wanted, status=ArtifactStatus.COMPLETE).order_by("path")
        for artifact in complete:
            found.setdefault(artifact.job_id, []).append(artifact)
    inputs = {pk: _inputs(j, by_job[pk], run_sources, found) for pk, j in ((j.pk, j) for j in jobs)}
    return JobExtras(inputs, _checkpoints(jobs))


K = TypeVar("K")


@dataclass(frozen=True)
class JobData:
    """What a job reads from its ``inputs:`` URIs and which volumes it mounts, as the run page shows them."""

    inputs: list[dict[str, Any]]  # uri, path, read_only, file_count, total_size, versioned
    volumes: list[dict[str, Any]]  # name, path, read_only


def job_data(*, workspace_id: uuid.UUID | str, specs: Mapping[K, Mapping[str, Any]]) -> dict[K, JobData]:
    """Each job's data inputs with their listings' sizes and its volumes, from
    the ``data`` and ``volumes`` items of its spec (``specs``: job key ->
    spec, or any mapping holding those two keys). The snapshots of all the
    jobs are read in one query, only ``workspace_id``'s, and none when no job
    names one; an input whose snapshot is not found shows no counts."""
    digests = {str(i.get("snapshot")) for spec in specs.values() for i in spec.get("data") or [] if i.get("snapshot")}
    found = {}
    if digests:
        rows = DataSnapshot.objects.filter(workspace_id=workspace_id, digest__in=digests)
        found = {
            d: (n, size, v) for d, n, size, v in rows.values_list("digest", "file_count", "total_size", "versioned")
        }
    return {key: _job_data(spec, found) for key, spec in specs.items()}


def _job_data(spec: Mapping[str, Any], found: Mapping[str, tuple[int, int, bool]]) -> JobData:
    inputs = []
    for item in spec.get("data") or []:
        count, size, versioned = found.get(str(item.get("snapshot") or ""), (None, None, False))
        inputs.append(
            {
                "uri": str(item.get("uri", "")),
                "path": str(item.get("path", "")),
                "read_only": bool(item.get("read_only", True)),
                "file_count": count,
                "total_size": size,
                "versioned": versioned,
            }
        )
    volumes = [
        {"name": str(v.get("name", "")), "path": str(v.get("path", "")), "read_only": bool(v.get("read_only", False))}
        for v in spec.get("volumes") or []
    ]
    return JobData(inputs, volumes)


def run_get(*, workspace: Workspace, ref: str) -> Run | None:
    """A run by short name or UUID, only within ``workspace``."""
    return run_by_ref(workspace=workspace, ref=ref).select_related("submitted_by").first()


def run_by_ref(*, workspace: Workspace, ref: str) -> QuerySet[Run]:
    """The run ``ref`` names within ``workspace``, as a query (``models.runs_named``:
    a name, UUID, ``tag:NAME`` or ``WORKFLOW@latest``)."""
    return runs_named(Run.objects.for_workspace(workspace), ref)


def job_get(*, workspace: Workspace, job_id: str) -> Job | None:
    if not _is_uuid(job_id):
        return None
    return Job.objects.for_workspace(workspace).filter(pk=job_id).first()


@dataclass(frozen=True)
class LogPage:
    lines: list[tuple[int, float, str, str]]  # (seq, unix ts, stream, text) in seq order
    has_more: bool  # more lines follow (ask again after lines[-1]'s seq)


def job_log_page(*, job: Job, after_seq: int, limit: int, max_bytes: int, until: int | None = None) -> LogPage:
    """The job's lines after ``after_seq`` (up to ``until``): at most
    ``limit`` lines and ``max_bytes`` bytes of text, and always at least one
    line when any is left. The caller checked tenancy on ``job``. Reads the
    few chunks the page needs, READ_ROWS at a time."""
    end = until if until is not None else LAST_SEQ
    lines: list[tuple[int, float, str, str]] = []
    size, has_more = 0, False
    for chunk in chunks_forward(str(job.pk), after=after_seq, until=end, rows=4):
        for seq, ts, stream, text in clipped(chunk, after=after_seq, until=end).lines():
            size += len(text)
            if len(lines) >= limit or (lines and size > max_bytes):
                has_more = True
                break
            lines.append((seq, ts, stream, text))
        if has_more:
            break
    return LogPage(lines, has_more)


def job_log_lines(*, job_id: str, after_seq: int = 0, until: int = LAST_SEQ) -> list[tuple[int, float, str, str]]:
    """Every stored line of the job in the range, (seq, unix ts, stream,
    text) in seq order: for small logs (tests, admin checks), not pages."""
    return [
        line
        for chunk in chunks_forward(job_id, after=after_seq, until=until)
        for line in clipped(chunk, after=after_seq, until=until).lines()
    ]


def _sources(job: Job) -> list[tuple[uuid.UUID, str]]:
    """(where its artifacts are, "job <name>") of each job ``job`` needs."""
    names = getattr(job, "need_names", None)  # with_shown's array columns
    if names is not None:
        return [(source, f"job {name}") for source, name in zip(job.need_sources, names, strict=True)]  # type: ignore[attr-defined]
    return [(dep.cached_from_id or dep.pk, f"job {dep.name}") for dep in job.needs.all()]


def _inputs(
    job: Job,
    sources: list[tuple[uuid.UUID, str]],
    run_sources: dict[str, list[uuid.UUID]],
    found: dict[uuid.UUID, list[Artifact]],
) -> list[tuple[str, str]]:
    """As ``dag.job_inputs``: each needed job's artifacts, then each ref's run's (by path)."""
    shown = [(a.path, origin) for source, origin in sources for a in found.get(source, [])]
    for ref in job.input_refs:
        artifacts = [a for s in run_sources.get(str(ref["run_id"]), []) for a in found.get(s, [])]
        shown += [(a.path, ref_origin(ref)) for a in sorted(artifacts, key=lambda a: a.path)]
    return shown


def _checkpoints(jobs: list[Job]) -> dict[uuid.UUID, CheckpointLatest]:
    ids = [j.pk for j in jobs if j.spec.get("checkpoint")]
    if not ids:
        return {}
    pointers = CheckpointLatest.objects.filter(job_id__in=ids).select_related("version")
    return {p.job_id: p for p in pointers.annotate(version_files=Count("version__files"))}


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


# ------------------------------------------------------------ environments


ENVIRONMENT_KEY = re.compile(r"[0-9a-f]{24}")


def environment_list(*, workspace: Workspace) -> list[Environment]:
    """The workspace's environments, last used first (at most 500), each
    with ``run_count`` (one query)."""
    return list(_environments(workspace).defer("lock").order_by("-last_used_at", "key")[:500])


def environment_get(*, workspace: Workspace, key: str) -> Environment | None:
    if not ENVIRONMENT_KEY.fullmatch(key):  # nothing else is a key (and Postgres refuses a NUL)
        return None
    return _environments(workspace).filter(key=key).first()


def environment_runs(*, workspace: Workspace, key: str, limit: int = 20) -> list[str]:
    """The names of the latest runs whose jobs ran in the environment ``key``."""
    rows = (
        Run.objects.for_workspace(workspace)
        .filter(pk__in=Attempt.objects.filter(job__workspace=workspace, environment_key=key).values("job__run_id"))
        .order_by("-created_at")
        .values_list("name", flat=True)[:limit]
    )
    return list(rows)


def _environments(workspace: Workspace) -> Any:
    runs = (
        Attempt.objects.filter(job__workspace=workspace, environment_key=OuterRef("key"))
        .order_by()
        .values("environment_key")
        .annotate(n=Count("job__run", distinct=True))
        .values("n")
    )
    packed = EnvironmentArchive.objects.filter(workspace=workspace, key=OuterRef("key"), complete=True)
    return Environment.objects.for_workspace(workspace).annotate(
        run_count=Coalesce(Subquery(runs, output_field=IntegerField()), 0), stored=Exists(packed)
    )


# What ``names_list`` answers for, and the most names it gives.
NAME_KINDS = ("run", "workflow", "tag", "environment")
MAX_NAMES = 50


def names_list(*, workspace: Workspace, kind: str, prefix: str) -> list[str]:
    """At most MAX_NAMES of the workspace's names of ``kind`` that start with
    ``prefix``: runs newest first, the rest in order (shell completion reads
    this on every Tab, so each kind is one query of at most MAX_NAMES rows)."""
    if "\x00" in prefix:
        return []
    if kind == "run":
        runs = Run.objects.for_workspace(workspace).filter(name__startswith=prefix).order_by("-created_at", "-id")
        return list(runs.values_list("name", flat=True)[:MAX_NAMES])
    if kind == "workflow":
        runs = Run.objects.for_workspace(workspace).filter(workflow__startswith=prefix)
        return list(runs.order_by("workflow").values_list("workflow", flat=True).distinct()[:MAX_NAMES])
    if kind == "tag":
        tags = Tag.objects.for_workspace(workspace).filter(name__startswith=prefix).order_by("name")
        return list(tags.values_list("name", flat=True)[:MAX_NAMES])
    envs = Environment.objects.for_workspace(workspace).filter(key__startswith=prefix).order_by("key")
    return list(envs.values_list("key", flat=True)[:MAX_NAMES])

"""Reads for runs, jobs and logs. Every selector requires ``workspace``."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import Count, Exists, IntegerField, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce, JSONObject

from backend.accounts.models import User, Workspace
from backend.artifacts.models import Artifact, ArtifactStatus, CheckpointLatest
from backend.clouds.models import Instance
from backend.core.cursors import Position, cursor_decode, cursor_encode
from backend.runs.models import LIVE_ATTEMPT, Attempt, Environment, EnvironmentArchive, Job, Run, Tag
from backend.runs.services.dag import ref_origin
from backend.runs.services.logchunks import LAST_SEQ, chunks_forward, clipped


def run_list(
    *, workspace: Workspace, status: str = "", workflow: str = "", q: str = "", tag: str = ""
) -> QuerySet[Run]:
    """The workspace's runs matching the filters, newest first (``-created_at, -id``:
    the order of the ``run_ws_*`` indexes), with what ``RunOut`` shows prefetched."""
    runs = Run.objects.for_workspace(workspace).select_related("submitted_by").order_by("-created_at", "-id")
    if status:
        runs = runs.filter(status__in=status.split(","))
    if workflow:
        runs = runs.filter(workflow=workflow)
    if q:
        runs = runs.filter(_search(q))
    if tag:
        runs = runs.filter(tags__name=tag)
    return with_shown(runs)


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
    rows = getattr(job, "attempt_rows", None)
    if rows is None:
        return list(job.attempts.select_related("instance").order_by("number"))
    return [_attempt_of(row) for row in rows]


# What AttemptOut shows of an attempt and its instance, as one JSON object per attempt.
_ATTEMPT_SHOWN = {
    **{f: f for f in ("number", "status", "termination_reason", "termination_message", "exit_code")},
    **{f: f for f in ("started_at", "finished_at", "first_seq", "last_seq", "offers_tried")},
    **{f: f for f in ("restored_checkpoint", "environment_key", "created_at", "instance_id")},
    **{f"instance_{f}": f"instance__{f}" for f in ("name", "backend", "instance_type", "region", "zone", "spot")},
}
_DATES = ("started_at", "finished_at", "created_at")


def _attempt_of(row: dict[str, Any]) -> Attempt:
    values = {k: v for k, v in row.items() if not k.startswith("instance_")}
    for name in _DATES:
        values[name] = datetime.fromisoformat(values[name]) if values[name] else None
    attempt = Attempt(**values)
    if row["instance_id"]:
        fields = {
            k.removeprefix("instance_"): v for k, v in row.items() if k.startswith("instance_") and k != "instance_id"
        }
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
    runs: list[Run]
    next: str | None  # the cursor of the page after this one (None: the last page)
    count: int
    count_estimated: bool  # ``count`` is the planner's estimate (above RUNS_EXACT_COUNT_UP_TO)


def run_page(*, runs: QuerySet[Run], cursor: str, size: int) -> RunPage:
    """One keyset page of ``runs`` (ordered ``-created_at, -id``) after
    ``cursor`` ("": the first page). A page costs the same at page 1 and
    page 10,000: it starts from an index position, not an OFFSET.

    1. ``size + 1`` rows after the cursor: the extra one says a next page exists.
    2. The total: a first page that is not full counts itself; else counted
       while cheap, or the planner's estimate (``_count``).
    """
    page = runs
    if cursor:
        at = cursor_decode(cursor)
        # Row comparison spelled so the (workspace, …, created_at, id) index bounds it.
        page = page.filter(Q(created_at__lt=at.created_at) | Q(created_at=at.created_at, id__lt=at.id))
    rows = list(page[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    after = cursor_encode(Position(rows[-1].created_at, rows[-1].id)) if more else None
    count, estimated = (len(rows), False) if not cursor and not more else _count(runs)
    return RunPage(rows, after, count, estimated)


def _search(q: str) -> Q:
    """Name, workflow or submitter contains ``q`` (any case). The name and
    workflow use trigram indexes (``run_name_trgm``, ``run_workflow_trgm``);
    the submitters are looked up first, so the three arms combine as one
    bitmap OR on indexes instead of a scan of the workspace's runs."""
    users = list(User.objects.filter(username__icontains=q).values_list("pk", flat=True)[:1000])
    return Q(name__icontains=q) | Q(workflow__icontains=q) | Q(submitted_by_id__in=users)


def _count(runs: QuerySet[Run]) -> tuple[int, bool]:
    """Exact up to ``RUNS_EXACT_COUNT_UP_TO``, else the planner's row estimate.

    1. The estimate (planning only: no row is read). Far above the cap (10×)
       it is the answer: an exact count there would read every match.
    2. Else a count capped at cap + 1 rows (at most that many index entries):
       exact when under the cap, so a small workspace is exact even when the
       statistics are stale; over it, the larger of the two.
    """
    cap = settings.TRAINYARD["RUNS_EXACT_COUNT_UP_TO"]
    plain = runs.order_by().values("pk")
    estimate = int(json.loads(plain.explain(format="json"))[0]["Plan"]["Plan Rows"])
    if estimate > 10 * cap:
        return estimate, True
    exact = plain[: cap + 1].count()
    if exact <= cap:
        return exact, False
    return max(estimate, exact), True


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


def run_get(*, workspace: Workspace, ref: str) -> Run | None:
    """A run by short name or UUID, only within ``workspace``."""
    if "\x00" in ref:  # no name has one, and Postgres refuses it (a websocket path is not checked by middleware)
        return None
    runs = Run.objects.for_workspace(workspace).select_related("submitted_by")
    if _is_uuid(ref):
        return runs.filter(pk=ref).first()
    return runs.filter(name=ref).first()


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


def attempt_current(*, job_id: str, number: int, instance_id: str) -> Attempt | None:
    """The job's live attempt ``number`` on ``instance_id``, if it is the current one."""
    return (
        Attempt.objects.filter(job_id=job_id, number=number, instance_id=instance_id, status__in=LIVE_ATTEMPT)
        .filter(job__attempt=number)
        .first()
    )


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

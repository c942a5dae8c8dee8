"""Submitting and stopping runs."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from django.db import connection, transaction
from trainyard_spec import JobPlan, RunPlan, WorkflowFileError, load_workflows_file, resolve_run_plan

from backend.accounts.models import User, Workspace
from backend.artifacts.models import Blob
from backend.core.errors import ApplicationError
from backend.repos.models import Repo
from backend.repos.services import repo_get_or_create
from backend.runs.models import FINISHED_RUN, CodeKind, Job, JobStatus, Run, RunStatus, Tag
from backend.runs.names import run_name
from backend.runs.services.transitions import job_request_stop, run_refresh, run_request_stop

COMMIT_RE = re.compile(r"^[0-9a-f]{7,64}$")


@dataclass(frozen=True)
class CodeInput:
    kind: str
    repo_url: str = ""
    commit: str = ""
    patch_blob: str | None = None
    archive_blob: str | None = None


def run_create(
    *,
    workspace: Workspace,
    user: User,
    workflow: str,
    workflows_file_path: str,
    workflows_file_text: str,
    code: CodeInput,
    env: dict[str, str],
    no_cache: bool = False,
    placement: dict[str, object] | None = None,
) -> Run:
    """Validate the workflow file again (the CLI did too, but the API is
    public), resolve its plan and the tags and runs it uses, then write the
    run and its jobs and enqueue scheduling. Nothing is written when
    anything is wrong. ``placement``: overrides of every workflow's
    placement keys (the CLI's ``--backend``, ``--region``, …)."""
    plan = resolve_plan(workflows_file_path, workflows_file_text, workflow, env)
    retries = _retry_policies(workflows_file_path, workflows_file_text)
    placements = placements_of(workflows_file_path, workflows_file_text, placement or {})
    refs = resolve_refs(workspace, plan)
    patch, archive = _code_blobs(workspace, code)
    with transaction.atomic():
        number = _next_run_number(workspace)
        run = Run.objects.create(
            workspace=workspace,
            name=run_name(number),
            workflow=workflow,
            submitted_by=user,
            repo=_repo(workspace, code.repo_url) if code.kind == CodeKind.GIT else None,
            code_kind=code.kind,
            repo_url=code.repo_url,
            commit=code.commit,
            patch_blob=patch,
            archive_blob=archive,
            workflows_file_path=workflows_file_path,
            workflows_file_text=workflows_file_text,
            env_overrides=env,
            placement_overrides=placement or {},
            no_cache=no_cache,
            status_reason="waiting for a runner",
        )
        _jobs_create(run, plan, refs, retries, placements)
        transaction.on_commit(_enqueue_schedule)
    return run


def run_rerun(*, run: Run, user: User) -> Run:
    """A new run of the same workflow, code, workflow file and env overrides."""
    return run_create(
        workspace=run.workspace,
        user=user,
        workflow=run.workflow,
        workflows_file_path=run.workflows_file_path,
        workflows_file_text=run.workflows_file_text,
        code=CodeInput(
            kind=run.code_kind,
            repo_url=run.repo_url,
            commit=run.commit,
            patch_blob=str(run.patch_blob_id) if run.patch_blob_id else None,
            archive_blob=str(run.archive_blob_id) if run.archive_blob_id else None,
        ),
        env=dict(run.env_overrides),
        no_cache=run.no_cache,
        placement=dict(run.placement_overrides),
    )


def run_stop(*, run: Run, user: User) -> Run:
    """Stop every job of the run; running ones are killed by their runner."""
    if run.status in FINISHED_RUN:
        return run
    with transaction.atomic():
        run_request_stop(run=run)
        for job in run.jobs.exclude(status__in=[JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED]):
            job_request_stop(job=job, reason=f"stopped by {user.username}")
        run = run_refresh(run_id=str(run.pk))
        transaction.on_commit(lambda: _send_cancels(str(run.pk)))
    return run


def _send_cancels(run_id: str) -> None:
    from backend.runs.services.scheduling import job_send_cancel

    for job in Job.objects.filter(run_id=run_id, status=JobStatus.STOPPING).select_related("instance"):
        job_send_cancel(job=job)


def resolve_plan(path: str, text: str, workflow: str, env: dict[str, str]) -> RunPlan:
    try:
        file = load_workflows_file(text, path=path)
        return resolve_run_plan(file, workflow, env_overrides=env)
    except WorkflowFileError as exc:
        errors = [dataclasses.asdict(e) for e in exc.errors]
        raise ApplicationError(str(exc), extra={"errors": errors}) from None


def resolve_refs(workspace: Workspace, plan: RunPlan) -> dict[str, list[dict[str, str]]]:
    """Each job's ``deps: - tag/run`` as run ids, fixed at submission: a tag
    moved later does not change what this run uses."""
    refs: dict[str, list[dict[str, str]]] = {}
    for job in plan.jobs:
        refs[job.name] = [_tag_ref(workspace, t) for t in job.tags] + [_run_ref(workspace, r) for r in job.runs]
    return refs


def job_spec(plan: JobPlan) -> dict[str, object]:
    """What a job runs, as stored and as hashed for the cache."""
    return {
        "provider": plan.provider,
        "commands": list(plan.commands),
        "env": dict(plan.env),
        "artifacts": list(plan.artifacts),
        "resources": dataclasses.asdict(plan.resources),
        "ports": list(plan.ports),
        "image": plan.image,
        # Only when set: a job without one keeps its cache key.
        **({"checkpoint": plan.checkpoint} if plan.checkpoint else {}),
        **({"on_interruption": plan.on_interruption} if plan.on_interruption != "restart_group" else {}),
    }


def _tag_ref(workspace: Workspace, name: str) -> dict[str, str]:
    tag = Tag.objects.for_workspace(workspace).select_related("run").filter(name=name).first()
    if tag is None:
        known = ", ".join(Tag.objects.for_workspace(workspace).order_by("name").values_list("name", flat=True)[:20])
        raise ApplicationError(
            f"deps: tag {name!r} does not exist in this workspace"
            + (f" (tags: {known})" if known else "")
            + f"; tag a successful run with: trainyard tag add {name} RUN"
        )
    return {"kind": "tag", "name": name, "run_id": str(tag.run_id), "run_name": tag.run.name}


def _run_ref(workspace: Workspace, name: str) -> dict[str, str]:
    run = Run.objects.for_workspace(workspace).filter(name=name).first()
    if run is None:
        raise ApplicationError(f"deps: run {name!r} does not exist in this workspace.")
    if run.status != RunStatus.SUCCEEDED:
        raise ApplicationError(f"deps: run {name!r} {run.status}: only a successful run's artifacts can be used.")
    return {"kind": "run", "name": name, "run_id": str(run.pk), "run_name": name}


def _code_blobs(workspace: Workspace, code: CodeInput) -> tuple[Blob | None, Blob | None]:
    if code.kind == CodeKind.GIT:
        if not code.repo_url or not COMMIT_RE.match(code.commit):
            raise ApplicationError("code.kind 'git' needs repo_url and a commit (hex sha).")
        return _blob(workspace, code.patch_blob, "patch_blob"), None
    if code.kind == CodeKind.ARCHIVE:
        if not code.archive_blob:
            raise ApplicationError("code.kind 'archive' needs archive_blob (upload the archive to /blobs/ first).")
        return None, _blob(workspace, code.archive_blob, "archive_blob")
    raise ApplicationError(f"code.kind must be 'git' or 'archive', not {code.kind!r}.")


def _blob(workspace: Workspace, blob_id: str | None, field: str) -> Blob | None:
    if not blob_id:
        return None
    blob: Blob | None = Blob.objects.for_workspace(workspace).filter(pk=blob_id).first()
    if blob is None:
        raise ApplicationError(f"{field} {blob_id} is not a blob of this workspace: upload it to /blobs/ first.")
    return blob


def _next_run_number(workspace: Workspace) -> int:
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE accounts_workspace SET run_counter = run_counter + 1 WHERE id = %s RETURNING run_counter",
            [workspace.pk],
        )
        return int(cur.fetchone()[0])


def _repo(workspace: Workspace, url: str) -> Repo:
    return repo_get_or_create(workspace=workspace, url=url)


def _retry_policies(path: str, text: str) -> dict[str, dict[str, object]]:
    """Each workflow's ``retry:`` as stored on its jobs ({}: the defaults)."""
    file = load_workflows_file(text, path=path)  # already validated by resolve_plan
    return {name: wf.retry.policy() if wf.retry is not None else {} for name, wf in file.workflows.items()}


def placements_of(path: str, text: str, overrides: dict[str, object]) -> dict[str, dict[str, object]]:
    """Each workflow's placement keys (``Workflow.placement``) with the
    overrides on top, as stored on its jobs."""
    file = load_workflows_file(text, path=path)  # already validated by resolve_plan
    return {name: {**wf.placement(), **overrides} for name, wf in file.workflows.items()}


def _jobs_create(
    run: Run,
    plan: RunPlan,
    refs: dict[str, list[dict[str, str]]],
    retries: dict[str, dict[str, object]],
    placements: dict[str, dict[str, object]],
) -> list[Job]:
    """One Job per planned job (dependencies first), then the DAG's edges."""
    by_name: dict[str, Job] = {}
    for planned in plan.jobs:
        resources = planned.resources
        by_name[planned.name] = Job.objects.create(
            workspace=run.workspace,
            run=run,
            name=planned.name,
            workflow=planned.workflow,
            spec=job_spec(planned),
            cpu=resources.cpu,
            memory_bytes=resources.memory_bytes,
            gpu_count=resources.gpu_count or 0,
            gpu_name=resources.gpu_name or "",
            ports=list(planned.ports),
            input_refs=refs[planned.name],
            retry_policy=retries.get(planned.workflow, {}),
            placement=placements.get(planned.workflow, {}),
            status_reason="waiting for a runner",
        )
    for planned in plan.jobs:
        job = by_name[planned.name]
        job.needs.set([by_name[n] for n in planned.needs])
        job.after_running.set([by_name[n] for n in planned.after_running])
    return list(by_name.values())


def _enqueue_schedule() -> None:
    from backend.runs.tasks import schedule

    schedule.delay()

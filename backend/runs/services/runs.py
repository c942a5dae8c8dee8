"""Submitting and stopping runs."""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from trainyard_spec import (
    JobPlan,
    ResourceOverrideError,
    RunPlan,
    Source,
    WorkflowFileError,
    WorkflowsFile,
    load_workflows,
    resolve_run_plan,
)
from trainyard_spec.schema import DEV_ENVIRONMENT_PROVIDERS

from backend.accounts.guards import guard_defaults_parse
from backend.accounts.models import AuditKind, User, Workspace
from backend.accounts.services.audit import Actor, audit_record
from backend.artifacts.models import Blob
from backend.billing.selectors import shown
from backend.clouds.services.volumes import volumes_check_plan
from backend.core.db import retry_on_conflict
from backend.core.errors import ApplicationError
from backend.core.urlcreds import url_without_credentials
from backend.repos.models import Repo
from backend.repos.services import repo_get_or_create
from backend.runs.lifecycle.devenvs import app_token_seal
from backend.runs.lifecycle.guards import guards_resolved
from backend.runs.lifecycle.privateenv import (
    PrivateInputs,
    private_digest,
    private_inputs_of,
    private_names,
    private_seal,
    private_split,
)
from backend.runs.lifecycle.transitions import job_request_stop, run_lock, run_refresh, run_request_stop
from backend.runs.models import FINISHED_RUN, Attempt, CodeKind, Environment, Job, JobStatus, Run, RunStatus, Tag
from backend.runs.names import run_name_stem
from backend.runs.scheduler.handover import run_assign_on_submit
from backend.runs.services.admission import (
    Estimate,
    JobEstimate,
    budgets_admit,
    job_estimate,
    max_cost_check,
    override_check,
)
from backend.runs.services.datainputs import inputs_list
from backend.runs.services.offerplan import offer_plan
from backend.runs.services.submissions import Once, submission_key_bind, submission_key_claim
from backend.runs.wakeups import schedule_soon
from backend.vault.services import secret_names

COMMIT_RE = re.compile(r"^[0-9a-f]{7,64}$")
# A run's name until its submission numbers it, just before the commit: never
# seen outside the transaction.
UNNUMBERED = "~unnumbered-"


@dataclass(frozen=True)
class CodeInput:
    kind: str
    repo_url: str = ""
    commit: str = ""
    patch_blob: str | None = None
    archive_blob: str | None = None
    # {path: digest of its part of the patch}: names changed files in cache decisions.
    patch_files: dict[str, str] | None = None


@dataclass(frozen=True)
class PlanInputs:
    """What a run's plan is made of besides the code: the workflows files and
    the submitter's values (the server never reads its own environment for
    them). ``inherited_env``: values of bare ``env`` names from the CLI's
    shell; ``run_args``: ``trainyard run W -- ARGS``; ``variables``: per
    workflow, the values of ``${{ variables.NAME }}``; ``resources``: the
    ``resources:`` keys that replace every workflow's (``run --gpu …``)."""

    files: tuple[Source, ...]
    env: dict[str, str] = field(default_factory=dict)
    inherited_env: dict[str, str] = field(default_factory=dict)
    run_args: tuple[str, ...] = ()
    variables: dict[str, dict[str, str]] = field(default_factory=dict)
    # {requirements file: {path: sha256}}: what the environments' files held
    # in the submitter's working tree (``trainyard_spec.environments``).
    environment_files: dict[str, dict[str, str]] = field(default_factory=dict)
    resources: dict[str, object] = field(default_factory=dict)


def plan_inputs(
    *,
    files: Sequence[Mapping[str, str]],
    env: dict[str, str],
    inherited_env: dict[str, str] | None = None,
    run_args: Sequence[str] = (),
    variables: dict[str, dict[str, str]] | None = None,
    environment_files: Mapping[str, Mapping[str, str]] | None = None,
    resources: Mapping[str, object] | None = None,
) -> PlanInputs:
    """PlanInputs from the API's (or a stored run's) plain values."""
    return PlanInputs(
        files=tuple(Source(f["path"], f["text"]) for f in files),
        env=dict(env),
        inherited_env=dict(inherited_env or {}),
        run_args=tuple(run_args),
        variables={k: dict(v) for k, v in (variables or {}).items()},
        environment_files={k: dict(v) for k, v in (environment_files or {}).items()},
        resources=dict(resources or {}),
    )


def run_create(
    *,
    workspace: Workspace,
    user: User,
    workflow: str,
    code: CodeInput,
    env: dict[str, str] | None = None,
    workflows_file_path: str = "",
    workflows_file_text: str = "",
    inputs: PlanInputs | None = None,
    no_cache: bool = False,
    placement: dict[str, object] | None = None,
    environment_locks: Mapping[str, str] | None = None,
    rerun_of: Run | None = None,
    environment_build: bool = False,
    once: Once | None = None,
    max_cost: Decimal | None = None,
    queue: bool = False,
    budget_override: bool = False,
    address: str = "",
) -> Run:
    """Validate the workflows files again (the CLI did too, but the API is
    public), resolve its plan and the tags and runs it uses, then write the
    run and its jobs and enqueue scheduling. Nothing is written when
    anything is wrong. ``inputs``: the files and values the plan is made
    of (without: the one file ``workflows_file_path``/``_text`` and ``env``).
    ``placement``: overrides of every workflow's placement keys (the CLI's
    ``--backend``, ``--region``, …). ``environment_locks``: by job name, the
    lock its environment installs instead of resolving its requirements
    again (a re-run; docs/ENVIRONMENTS.md). ``environment_build``: only
    build ``workflow``'s environment (``environment_build_plan``).
    ``once``: the submission's ``Idempotency-Key``, claimed first in the
    transaction (``KeyTaken`` if a copy of this submission made its run).
    ``max_cost``: the run's own cap (wins over the workflow's ``max_cost``).
    Admission (``admission``): a run the budgets have no room for is refused
    before anything is written, or with ``queue`` written with its jobs
    waiting for budget; ``budget_override`` (admins only, audited) lets it
    past the workspace's and the submitter's budgets."""
    inputs = inputs or PlanInputs(files=(Source(workflows_file_path, workflows_file_text),), env=dict(env or {}))
    # Stored on the run and the repo and shown to the whole workspace: never a credential.
    code = dataclasses.replace(code, repo_url=url_without_credentials(code.repo_url.strip()))
    file = load_files(inputs.files)
    plan = resolve_plan(file, workflow, inputs, known_secrets=secret_names(workspace_id=workspace.pk))
    if environment_build:
        plan = environment_build_plan(plan)
    retries = _retry_policies(file)
    placements = placements_of(file, placement or {}, workspace)
    for job in plan.jobs:
        if job.volumes:
            where = placements.get(job.workflow) or {}
            volumes_check_plan(
                workspace_id=workspace.pk,
                job=job.name,
                wanted=[str(v["name"]) for v in job.volumes],
                backends=[str(b) for b in where.get("backends") or ()],  # type: ignore[attr-defined]
                regions=[str(r) for r in where.get("regions") or ()],  # type: ignore[attr-defined]
            )
    refs = resolve_refs(workspace, plan)
    if budget_override:
        override_check(workspace=workspace, user=user)
    estimate = Estimate(tuple(_job_estimates(workspace, plan, placements)))
    max_cost = max_cost if max_cost is not None else _max_cost_of(file, workflow)
    if max_cost is not None:
        max_cost_check(max_cost=max_cost, estimate=estimate)
    # Network calls (S3 listings, HEADs): before the transaction, never inside it.
    listed = inputs_list(workspace_id=workspace.pk, file=file, plan=plan, rerun_of=rerun_of)
    patch, archive = _code_blobs(workspace, code)
    private = private_names(env=inputs.env, inherited_env=inputs.inherited_env)
    sealed = private_seal(
        PrivateInputs(
            env=inputs.env,
            inherited_env=inputs.inherited_env,
            jobs={job.name: private_split(job.env, private)[1] for job in plan.jobs},
        )
    )
    with transaction.atomic():
        waiting = budgets_admit(
            workspace=workspace, user=user, estimate=estimate, override=budget_override, queue=queue
        )
        claim = submission_key_claim(workspace=workspace, user=user, once=once) if once is not None else None
        run = Run.objects.create(
            workspace=workspace,
            name=f"{UNNUMBERED}{uuid.uuid4().hex}",  # named last, by ``_number``
            workflow=workflow,
            help=(file.get(workflow).help or "")[:1000],
            submitted_by=user,
            repo=_repo(workspace, code.repo_url) if code.kind == CodeKind.GIT else None,
            code_kind=code.kind,
            repo_url=code.repo_url,
            commit=code.commit,
            patch_blob=patch,
            archive_blob=archive,
            patch_files=code.patch_files if patch is not None or archive is not None else None,
            # The first file, for what shows one; workflows_files has them all.
            workflows_file_path=inputs.files[0].path,
            workflows_file_text=inputs.files[0].text,
            workflows_files=[{"path": f.path, "text": f.text} for f in inputs.files],
            environment_files=inputs.environment_files,
            # Their values are private_inputs' (encrypted): never stored in the clear.
            env_overrides={},
            inherited_env={},
            private_inputs=sealed,
            run_args=list(inputs.run_args),
            variables=inputs.variables,
            placement_overrides=placement or {},
            resource_overrides=inputs.resources,
            no_cache=no_cache,
            rerun_of=rerun_of,
            environment_build=environment_build,
            max_cost=max_cost,
            budget_override=budget_override,
            status_reason=waiting or "waiting for a runner",
        )
        listed.store(workspace_id=workspace.pk)
        jobs = [dataclasses.replace(job, data=listed.data_of(job)) for job in plan.jobs]
        plan = dataclasses.replace(plan, jobs=jobs)
        _jobs_create(run, plan, refs, retries, placements, environment_locks or {}, inputs.environment_files, private)
        for estimated in estimate.jobs:
            Job.objects.filter(run=run, name=estimated.job).update(estimate_max_cost=estimated.max_cost)
        if waiting:  # the scheduler's budget hold starts its jobs when there is room
            Job.objects.filter(run=run).update(status_reason=waiting)
        else:
            run_assign_on_submit(run=run)
        if Job.objects.filter(run=run, status=JobStatus.PENDING).exists():
            schedule_soon()  # what no idle runner took waits for a pass
        if claim is not None:
            submission_key_bind(claim=claim, run=run)
        _number(run)
        if budget_override:
            audit_record(
                workspace_id=workspace.pk,
                kind=AuditKind.BUDGET,
                action="budget.override",
                actor=Actor(user=user, address=address),
                target=run.name,
                detail={"workflow": workflow, "estimate": shown(estimate.total)},
            )
    return run


def _job_estimates(
    workspace: Workspace, plan: RunPlan, placements: Mapping[str, Mapping[str, object]]
) -> list[JobEstimate]:
    """Each planned job's estimate from its cheapest offer now."""
    return [
        job_estimate(
            job=job.name,
            offer=offer_plan(
                workspace_id=workspace.pk,
                resources=dataclasses.asdict(job.resources),
                placement=placements.get(job.workflow) or {},
            ),
            placement=placements.get(job.workflow) or {},
        )
        for job in plan.jobs
    ]


def _max_cost_of(file: WorkflowsFile, workflow: str) -> Decimal | None:
    """The run's workflow's ``max_cost`` key (the workflows it depends on run
    as its jobs and count toward it; their own key is not the run's)."""
    value = file.get(workflow).max_cost
    return None if value is None else Decimal(str(value)).quantize(Decimal("0.01"))


def run_rerun(*, run: Run, user: User) -> Run:
    """A new run of the same workflow, code, workflows files and submitted values."""
    private = private_inputs_of(run)
    return run_create(
        workspace=run.workspace,
        user=user,
        workflow=run.workflow,
        inputs=plan_inputs(
            # A run from before workflows_files (migration 0010) has its one file only.
            files=run.workflows_files or [{"path": run.workflows_file_path, "text": run.workflows_file_text}],
            env=private.env,
            inherited_env=private.inherited_env,
            run_args=list(run.run_args),
            variables=dict(run.variables),
            environment_files=dict(run.environment_files),
            resources=dict(run.resource_overrides),
        ),
        code=CodeInput(
            kind=run.code_kind,
            repo_url=run.repo_url,
            commit=run.commit,
            patch_blob=str(run.patch_blob_id) if run.patch_blob_id else None,
            archive_blob=str(run.archive_blob_id) if run.archive_blob_id else None,
            patch_files=run.patch_files,
        ),
        no_cache=run.no_cache,
        placement=dict(run.placement_overrides),
        environment_locks=_environment_locks(run),
        rerun_of=run,
        environment_build=run.environment_build,
        max_cost=run.max_cost,
    )


def _environment_locks(run: Run) -> dict[str, str]:
    """By job name, the lock of the environment the job's latest attempt ran
    in: a re-run installs exactly those packages."""
    keys = {
        name: key
        for name, key in Attempt.objects.filter(job__run=run)
        .exclude(environment_key="")
        .order_by("job__name", "number")
        .values_list("job__name", "environment_key")
    }
    locks = dict(
        Environment.objects.for_workspace(run.workspace)
        .filter(key__in=set(keys.values()))
        .exclude(lock="")
        .values_list("key", "lock")
    )
    return {name: locks[key] for name, key in keys.items() if key in locks}


@retry_on_conflict
def run_stop(*, run: Run, user: User) -> Run:
    """Stop every job of the run; running ones are killed by their runner.
    The run's row is locked first, then its jobs in id order (docs/RUNS.md,
    "Locks"); a lost lock race is tried again, never answered with a 500."""
    if run.status in FINISHED_RUN:
        return run
    with transaction.atomic():
        run_lock(run_id=run.pk)
        run_request_stop(run=run)
        live = run.jobs.exclude(status__in=[JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED]).order_by("pk")
        for job in live:
            job_request_stop(job=job, reason=f"stopped by {user.username}")
        run = run_refresh(run_id=str(run.pk))
    return run


def load_files(files: Sequence[Source]) -> WorkflowsFile:
    """The workflows of ``files``; ApplicationError with file:line:key errors
    if a file is unusable (a broken workflow only fails a run of it)."""
    try:
        return load_workflows(files)
    except WorkflowFileError as exc:
        raise _file_errors(exc) from None


def environment_build_plan(plan: RunPlan) -> RunPlan:
    """``trainyard env build``: one job per distinct environment of the
    workflow's own jobs (not of the workflows it depends on), with no
    commands, artifacts, ports or inputs: the runner builds the environment,
    stores it, and the job succeeds."""
    jobs: dict[str, JobPlan] = {}
    for job in plan.jobs:
        if job.workflow != plan.workflow or not job.environment:
            continue
        jobs.setdefault(
            json.dumps(job.environment, sort_keys=True),
            dataclasses.replace(
                job,
                commands=[],
                artifacts=[],
                ports=[],
                needs=[],
                after_running=[],
                tags=[],
                runs=[],
                repo_workflows=[],
                checkpoint="",
                port_count=0,
                mounts=[],
                cache=[],
            ),
        )
    if not jobs:
        raise ApplicationError(
            f"workflow {plan.workflow!r} has no environment: nothing to build."
            " Give it environment: (or requirements: with provider: python); docs/ENVIRONMENTS.md"
        )
    return dataclasses.replace(plan, jobs=list(jobs.values()))


def resolve_plan(
    file: WorkflowsFile, workflow: str, inputs: PlanInputs, *, known_secrets: Collection[str] | None = None
) -> RunPlan:
    """The run's plan; ``known_secrets``: the workspace's secret names, which
    every secret a workflow names must be one of."""
    try:
        return resolve_run_plan(
            file,
            workflow,
            env_overrides=inputs.env,
            inherited_env=inputs.inherited_env,
            run_args=inputs.run_args,
            variables=inputs.variables,
            known_secrets=known_secrets,
            max_jobs=settings.TRAINYARD["MAX_JOBS_PER_RUN"],
            resources=inputs.resources,
        )
    except WorkflowFileError as exc:
        raise _file_errors(exc) from None
    except ResourceOverrideError as exc:
        raise ApplicationError(f"resources.{exc}", extra={"field": f"resources.{exc.key}"}) from None


def _file_errors(exc: WorkflowFileError) -> ApplicationError:
    return ApplicationError(str(exc), extra={"errors": [dataclasses.asdict(e) for e in exc.errors]})


def resolve_refs(workspace: Workspace, plan: RunPlan) -> dict[str, list[dict[str, str]]]:
    """Each job's ``deps: - tag/run`` as run ids, fixed at submission: a tag
    moved later does not change what this run uses."""
    refs: dict[str, list[dict[str, str]]] = {}
    for job in plan.jobs:
        refs[job.name] = (
            [_tag_ref(workspace, t) for t in job.tags]
            + [_run_ref(workspace, r) for r in job.runs]
            + [_repo_workflow_ref(workspace, w) for w in job.repo_workflows]
        )
    return refs


def _repo_workflow_ref(workspace: Workspace, ref: str) -> dict[str, str]:
    """``owner/repo/name``: the latest successful run of workflow ``name``
    from the workspace's repo ``owner/repo`` (dstack 0.x's other-repo deps)."""
    repo_name, _, workflow = ref.rpartition("/")
    repos = [r for r in Repo.objects.for_workspace(workspace) if _repo_path(r.url) == repo_name.lower()]
    if not repos:
        known = ", ".join(sorted({_repo_path(r.url) for r in Repo.objects.for_workspace(workspace)})[:10])
        raise ApplicationError(
            f"deps: workflow {ref!r}: no repository {repo_name!r} is connected to this workspace"
            + (f" (connected: {known})" if known else "")
            + f"; run a workflow from {repo_name} once (or connect it on the Repos page)"
        )
    run = (
        Run.objects.for_workspace(workspace)
        .filter(repo__in=repos, workflow=workflow, status=RunStatus.SUCCEEDED)
        .order_by("-finished_at", "-created_at")
        .first()
    )
    if run is None:
        raise ApplicationError(
            f"deps: workflow {ref!r}: {repo_name} has no successful run of {workflow!r} in this workspace yet."
        )
    return {"kind": "workflow", "name": ref, "run_id": str(run.pk), "run_name": run.name}


def _repo_path(url: str) -> str:
    """``owner/repo`` of a git URL (https://host/owner/repo.git, git@host:owner/repo)."""
    path = url.rstrip("/").removesuffix(".git").split("://", 1)[-1]
    path = path.split(":", 1)[-1] if "://" not in url and ":" in path else path.split("/", 1)[-1]
    return "/".join(path.split("/")[-2:]).lower()


def job_spec(
    plan: JobPlan,
    environment_files: Mapping[str, Mapping[str, str]] | None = None,
    private: Collection[str] = (),
) -> dict[str, object]:
    """What a job runs, as stored and as hashed for the cache.
    ``environment_files``: ``PlanInputs.environment_files``; the digests of
    the files this job's environment names go into its spec, so a changed
    requirements file is a cache miss that names it (``cachewhy``).
    ``private``: the variables whose values the submitter sent
    (``privateenv``): the spec keeps a digest of each, not the value."""
    files = environment_files_of(plan.environment, environment_files or {})
    env, hidden = private_split(plan.env, private)
    return {
        "provider": plan.provider,
        "commands": list(plan.commands),
        "env": env,
        **({"private_env": {k: private_digest(k, v) for k, v in hidden.items()}} if hidden else {}),
        "artifacts": list(plan.artifacts),
        "resources": dataclasses.asdict(plan.resources),
        "ports": list(plan.ports),
        "image": plan.image,
        # Only when set: a job without one keeps its cache key.
        **({"checkpoint": plan.checkpoint} if plan.checkpoint else {}),
        **({"on_interruption": plan.on_interruption} if plan.on_interruption != "restart_group" else {}),
        **({"on_server_lost": plan.on_server_lost} if plan.on_server_lost != "stop" else {}),
        **({"port_count": plan.port_count} if plan.port_count else {}),
        **({"mounts": list(plan.mounts)} if plan.mounts else {}),
        **({"cache": list(plan.cache)} if plan.cache else {}),
        **({"environment": dict(plan.environment)} if plan.environment else {}),
        **({"environment_files": files} if files else {}),
        # Names, never values: the job's runner fetches them (``delivery.job_secrets``).
        **({"secrets": dict(plan.secrets)} if plan.secrets else {}),
        **({"dev_environment": dev_environment_spec(plan)} if plan.dev_environment else {}),
        **({"metrics": metrics_spec(plan)} if plan.metrics or plan.metrics_interval or plan.metrics_per_minute else {}),
        # Each input's uri, path, read_only, sha256 pin and, once listed, the snapshot it reads.
        **({"data": [dict(item) for item in plan.data]} if plan.data else {}),
        **({"volumes": [dict(v) for v in plan.volumes]} if plan.volumes else {}),
        # {artifact path: ``to`` as written}: copied there once uploaded (``artifacts.exports``).
        **({"exports": dict(plan.exports)} if plan.exports else {}),
    }


def metrics_spec(plan: JobPlan) -> dict[str, object]:
    """The workflow's ``metrics:`` as stored (``dispatch`` puts it in ``AssignJob``)."""
    values = {"patterns": list(plan.metrics), "interval": plan.metrics_interval, "per_minute": plan.metrics_per_minute}
    return {k: v for k, v in values.items() if v}


def dev_environment_spec(plan: JobPlan) -> dict[str, object]:
    """A dev environment's kind and ``inactivity_duration`` as stored (``devenvs``)."""
    return {"kind": plan.dev_environment, "inactivity_duration": plan.inactivity_duration}


def environment_files_of(
    environment: Mapping[str, object] | None, known: Mapping[str, Mapping[str, str]]
) -> dict[str, str] | None:
    """The digests of the files ``environment`` names: {} when it names
    none, None when it names a file the submitter did not send digests of
    (or there is no environment)."""
    if not environment:
        return None
    requirements = environment.get("requirements")
    if not requirements:
        return {}
    files = known.get(str(requirements))
    return dict(files) if files is not None else None


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


def _number(run: Run) -> None:
    """Name the run after the workspace's next number, in the submission's
    last statement. Taking the number locks the workspace's counter until the
    commit, so the submissions to one workspace wait for each other only for
    that statement and the commit, not for each other's whole transaction
    (decision 0069). In the same transaction, so
    the numbers stay gapless; they follow the order the submissions commit in."""
    with connection.cursor() as cur:
        cur.execute(
            "WITH counter AS (UPDATE accounts_workspace SET run_counter = run_counter + 1 WHERE id = %s"
            " RETURNING run_counter)"
            " UPDATE runs_run SET name = %s || '-' || (SELECT run_counter FROM counter) WHERE id = %s RETURNING name",
            [run.workspace_id, run_name_stem(), run.pk],
        )
        run.name = cur.fetchone()[0]


def _repo(workspace: Workspace, url: str) -> Repo:
    return repo_get_or_create(workspace=workspace, url=url)


def _retry_policies(file: WorkflowsFile) -> dict[str, dict[str, object]]:
    """Each workflow's ``retry:`` as stored on its jobs ({}: the defaults)."""
    return {name: wf.retry.policy() if wf.retry is not None else {} for name, wf in file.workflows.items()}


def placements_of(
    file: WorkflowsFile, overrides: dict[str, object], workspace: Workspace | None = None
) -> dict[str, dict[str, object]]:
    """Each workflow's placement keys (``Workflow.placement``) with the
    overrides on top, and its guards (its own, else ``workspace``'s
    defaults; ``lifecycle.guards``), as stored on its jobs."""
    defaults = guard_defaults_parse(workspace.guard_defaults)[0] if workspace is not None else {}
    return {
        name: {
            **wf.placement(),
            **overrides,
            # A dev environment is quiet while a person thinks: its inactivity_duration is its guard.
            **guards_resolved(wf.guards(), {} if wf.provider in DEV_ENVIRONMENT_PROVIDERS else defaults),
        }
        for name, wf in file.workflows.items()
    }


def _jobs_create(
    run: Run,
    plan: RunPlan,
    refs: dict[str, list[dict[str, str]]],
    retries: dict[str, dict[str, object]],
    placements: dict[str, dict[str, object]],
    locks: Mapping[str, str],
    environment_files: Mapping[str, Mapping[str, str]],
    private: Collection[str],
) -> list[Job]:
    """One Job per planned job (dependencies first), then the DAG's edges."""
    by_name: dict[str, Job] = {}
    for planned in plan.jobs:
        if planned.environment and locks.get(planned.name):
            planned = dataclasses.replace(planned, environment={**planned.environment, "lock": locks[planned.name]})
        resources, spec = planned.resources, job_spec(planned, environment_files, private)
        by_name[planned.name] = Job.objects.create(
            workspace=run.workspace,
            run=run,
            name=planned.name,
            workflow=planned.workflow,
            spec=spec,
            app_token=app_token_seal(spec),
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
    for planned in plan.jobs:  # new rows have no edges: add them (set() reads the current ones first), if any
        job = by_name[planned.name]
        if planned.needs:
            job.needs.add(*[by_name[n] for n in planned.needs])
        if planned.after_running:
            job.after_running.add(*[by_name[n] for n in planned.after_running])
    return list(by_name.values())

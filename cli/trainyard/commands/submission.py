"""The plan-and-submit sequence of ``run``, ``rerun`` and ``env build``,
written once.

1. ``plan_locally``: read the workflows files and variables from the working
   tree and resolve the run's plan here, so a bad file or a dependency cycle
   is refused before anything is uploaded (``rerun`` skips this: the server
   re-runs what it recorded).
2. ``submit``: check the code's size, upload it and create the run (or, for
   a dry run, print the server's plan and create nothing).
3. ``follow_submitted``: announce the run, print each job's cheapest offer,
   then print the run name and return (``--detach``), or follow the run to
   its end and exit with ``run_exit_code``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import click
from trainyard_spec import (
    RunPlan,
    WorkflowsFile,
    find_variables_file,
    inherited_env_names,
    load_variables,
    load_workflows,
    resolve_run_plan,
    run_workflows,
)
from trainyard_spec.environments import environment_files

from ..api import Client, Job, Run, RunSubmission
from ..code import Workspace, code_digests, find_workspace, prepare_code
from ..guard import DEFAULT_WARN_BYTES, WARN_ENV, SizeGuard, parse_size
from ..output import (
    PLAN_HEADERS,
    estimate_words,
    offer_rows,
    plan_lines,
    print_table,
    reused_artifact_lines,
    reused_words,
)
from ..progress import transfers
from . import common


@dataclass(frozen=True)
class BudgetAsk:
    """``--max-cost`` (USD as typed: the server checks it), ``--queue``, ``--override-budget``."""

    max_cost: str | None = None
    queue: bool = False
    override: bool = False


@dataclass(frozen=True)
class RunRequest:
    """What a submission asks for beyond what the working tree holds."""

    workflow: str
    env: dict[str, str] = field(default_factory=dict)
    run_args: list[str] = field(default_factory=list)
    no_cache: bool = False
    placement: dict[str, Any] = field(default_factory=dict)
    # --gpu/--cpu/--memory/--disk as typed: the resources: keys they replace in every job.
    resources: dict[str, Any] = field(default_factory=dict)
    environment_build: bool = False
    budget: BudgetAsk = field(default_factory=BudgetAsk)


@dataclass(frozen=True)
class LocalRun:
    """A run read from the working tree and planned here."""

    request: RunRequest
    workspace: Workspace
    file: WorkflowsFile
    plan: RunPlan
    submission: RunSubmission


def plan_locally(request: RunRequest) -> LocalRun:
    """Read ``request.workflow``'s files and values from the working tree and
    resolve its plan; warns of the workflows that cannot be run."""
    workspace = find_workspace(Path.cwd())
    sources = common.workflow_sources(workspace.root)
    file = load_workflows(sources)
    workflow = request.workflow
    variables = _variables(workspace.root, [wf.name for wf in run_workflows(file, workflow)])
    # Only the bare env names of this run's workflows leave this machine.
    inherited = {n: os.environ[n] for n in inherited_env_names(file, workflow) if n in os.environ}
    plan = resolve_run_plan(
        file,
        workflow,
        env_overrides=request.env,
        inherited_env=inherited,
        run_args=request.run_args,
        variables=variables,
        resources=request.resources,
    )
    common.warn_broken(file)
    common.warn_ignored(file)
    sent = sorted({*inherited, *request.env})
    if sent:
        # Said before anything leaves: these values go to the server (encrypted there, masked in logs).
        click.echo(f"Sending from this shell and -e: {', '.join(sent)} (kept encrypted, masked in logs)", err=True)
    submission: RunSubmission = {
        "workflow": workflow,
        "workflows_files": [{"path": s.path, "text": s.text} for s in sources],
        "env": request.env,
        "inherited_env": inherited,
        "run_args": request.run_args,
        "variables": variables,
        "no_cache": request.no_cache,
        "placement": request.placement,
        "environment_files": environment_files_of_plan(workspace.root, plan),
    }
    if request.resources:
        submission["resources"] = request.resources
    if request.budget.max_cost is not None:
        submission["max_cost"] = request.budget.max_cost
    if request.budget.queue:
        submission["queue"] = True
    if request.budget.override:
        submission["budget_override"] = True
    return LocalRun(request, workspace, file, plan, submission)


def submit(
    api: Client, local: LocalRun, *, upload: bool, warn_bytes: int, yes: bool, dry_run: bool = False
) -> Run | None:
    """Upload the code and create the run; with ``dry_run``, print the plan
    the server would make of it and create nothing (None). Over
    ``warn_bytes`` of code the user is asked first (not with ``yes``, a dry
    run, or without a terminal); over the server's limit it is refused."""
    guard = SizeGuard(
        warn_bytes=warn_bytes,
        hard_bytes=api.server_info().get("max_blob_bytes"),
        ask=None if (yes or dry_run or not sys.stdin.isatty()) else common.confirm,
        warn=common.warn_lines,
    )
    if dry_run:
        digests = code_digests(local.workspace, force_upload=upload, warn=common.warn, check=guard)
        planned = api.plan_run(code=digests, **local.submission)
        local_help = local.file.get(local.request.workflow).help or ""
        click.echo("\n".join(plan_lines({**planned, "help": planned.get("help") or local_help})))
        click.echo("Nothing was submitted.", err=True)
        return None
    with transfers() as shown:

        def upload_blob(data: bytes | Path) -> Any:
            total = data.stat().st_size if isinstance(data, Path) else len(data)
            return api.upload_blob(data, on_bytes=shown.bar("Uploading code", total).advance)

        code = prepare_code(
            local.workspace, force_upload=upload, upload_blob=upload_blob, warn=common.warn, check=guard
        )
    return api.create_run(code=code, environment_build=local.request.environment_build, **local.submission)


def follow_submitted(
    api: Client,
    created: Run,
    announcement: str,
    *,
    detach: bool,
    report: Callable[[Client, Run], None] = lambda api, run: None,
    on_run: Callable[[Run], None] = lambda run: None,
    before_follow: Callable[[Run], None] = lambda run: None,
) -> None:
    """Announce the run just created, its dashboard page (``View: URL``) and
    each job's cheapest offer (stderr);
    with ``detach`` print its name and return, else follow it to its end,
    say which jobs were reused, ``report`` on it, and exit with
    ``run_exit_code``. ``before_follow`` is called once with the run just
    created, after the announcement; ``on_run`` with every update of the
    followed run."""
    click.echo(announcement, err=True)
    click.echo(f"View: {common.run_url(api, created['name'])}", err=True)
    offers = cast(dict[str, Any], created).get("plan")  # the creation answer only
    if offers:
        print_table(PLAN_HEADERS, offer_rows(offers), tty=sys.stderr.isatty(), out=sys.stderr)
        if (estimate := estimate_words(cast(dict[str, Any], created))) is not None:
            click.echo(estimate, err=True)
    if str(created.get("status_reason") or "").startswith("waiting for budget"):
        click.echo(f"Its jobs are {created['status_reason']}", err=True)
    before_follow(created)
    if detach:
        click.echo(created["name"])
        return
    final = common.follow(api, created["name"], seen={}, on_reused=_note_reused, on_run=on_run)
    _reused_summary(api, final)
    report(api, final)
    sys.exit(run_exit_code(final))


def run_exit_code(run: Run) -> int:
    """0 if succeeded; the exit code of the first job (by finish time) that
    failed with one; else 1."""
    if run["status"] == "succeeded":
        return 0
    if run["status"] == "failed":
        failed = sorted(
            (j for j in run["jobs"] if j.get("status") == "failed"), key=lambda j: j.get("finished_at") or "~"
        )
        codes = [j.get("exit_code") for j in failed] + [run.get("exit_code")]
        code = next((c for c in codes if isinstance(c, int) and c != 0), None)
        if code is not None:
            return code if 0 < code < 256 else 1
    return 1


def warn_size(option: str | None) -> int:
    """The size of code over which a submission asks first: ``option``
    (--code-warn-size), else $TRAINYARD_CODE_WARN_SIZE, else 20 MiB."""
    if option is not None:
        try:
            return parse_size(option)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--code-warn-size") from None
    if not os.environ.get(WARN_ENV):
        return DEFAULT_WARN_BYTES
    try:
        return parse_size(os.environ[WARN_ENV])
    except ValueError as e:
        raise common.CliError(f"{WARN_ENV}: {e}; fix or unset it") from None


def environment_files_of_plan(root: Path, plan: RunPlan) -> dict[str, dict[str, str]]:
    """{requirements file: {path: sha256}} for the environments of ``plan``'s
    jobs, read from the working tree (what the runner's checkout will hold):
    the server names a changed file as the reason a job is not reused, and
    ``--dry-run`` looks the environment up (docs/ENVIRONMENTS.md)."""
    base = root.resolve()

    def read(name: str) -> bytes | None:
        path = (base / name).resolve()
        if not path.is_relative_to(base):
            return None
        try:
            return path.read_bytes()
        except OSError:
            return None

    named = {str(env["requirements"]) for job in plan.jobs if (env := job.environment) and env.get("requirements")}
    return {name: environment_files(name, read) for name in sorted(named)}


def _variables(root: Path, workflows: list[str]) -> dict[str, dict[str, str]]:
    """Each of ``workflows``' values of ${{ variables.NAME }} from the variables file."""
    path = find_variables_file(root)
    if path is None:
        return {}
    variables = load_variables(common.read_text(path), path=path.relative_to(root).as_posix())
    return {name: values for name in workflows if (values := variables.of(name))}


def _note_reused(job: Job) -> None:
    """A job reused from the cache, as it is decided."""
    cache = job["cached_from"]
    assert cache is not None
    click.echo(f"{job['name']}: {reused_words(cache['run'])}", err=True)


def _reused_summary(api: Client, run: Run) -> None:
    """After a run of which jobs were reused: their artifacts, which stay in
    the runs that made them, and how to get them."""
    sources = list(dict.fromkeys(c["run"] for j in run["jobs"] if (c := j.get("cached_from"))))
    if not sources:
        return
    every = all(j.get("cached_from") for j in run["jobs"])
    lines = reused_artifact_lines(run, {source: api.list_artifacts(source) for source in sources})
    head = "Every job was reused from the cache:" if every else "Reused from the cache:"
    downloads = [f"Artifacts: trainyard artifacts download {source} -o DIR" for source in sources]
    click.echo("\n".join([head, *lines, *downloads, f"Their logs: trainyard logs {run['name']}"]), err=True)

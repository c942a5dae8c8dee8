"""The plan of a run: every job, in dependency order (``resolve_run_plan``).

Shared by the CLI (plans before anything is uploaded) and the server (plans
again on submit), so nothing here prints or touches a terminal. Everything a
plan depends on besides the files is an argument (the ``-e`` overrides, the
resource overrides of ``--gpu/--cpu/--memory/--disk``, the values of bare
``env`` names taken from the submitting shell, the run's ``-- args`` and the
variables): the server never reads its own environment.

``NOT_BUILT_YET`` is the one table of keys that parse and are carried on the
job plan but that the runner does not build yet: a run that uses one is
refused here, naming the key; other workflows of the same files run.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from .providers import JUPYTER_PACKAGES, RUNNER_PROVIDERS, JobPlan, ProviderError, get_provider
from .schema import NOT_SUPPORTED_YET, Resources, Workflow, WorkflowError, WorkflowFileError
from .workflows import WorkflowsFile

_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")
_VARIABLE = re.compile(r"variables\.([A-Za-z_][A-Za-z0-9_-]*)")
_SECRET = re.compile(r"secrets\.([A-Za-z_][A-Za-z0-9_]*)")
_SECRET_VALUE = re.compile(r"\$\{\{\s*secrets\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
ON_INTERRUPTION = ("restart_group", "job")
_Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class RunPlan:
    """Every job of a run of ``workflow``, dependencies first."""

    workflow: str
    jobs: list[JobPlan] = field(default_factory=list)

    def job(self, name: str) -> JobPlan:
        return next(job for job in self.jobs if job.name == name)


def resolve_run_plan(
    file: WorkflowsFile,
    workflow: str,
    *,
    env_overrides: Mapping[str, str],
    inherited_env: Mapping[str, str] | None = None,
    run_args: Sequence[str] = (),
    variables: Mapping[str, Mapping[str, str]] | None = None,
    known_secrets: Collection[str] | None = None,
    max_jobs: int | None = None,
    resources: Mapping[str, object] | None = None,
) -> RunPlan:
    """The plan of a run of ``workflow``; WorkflowFileError (file:line:key)
    for anything that keeps it from running.

    ``max_jobs``: the most jobs a run may have (the server's
    TRAINYARD_MAX_JOBS_PER_RUN); planning stops at the workflow whose jobs
    pass it, before the rest are made.

    ``inherited_env``: the values of bare ``env`` names (``env: [HF_TOKEN]``),
    taken from the submitting shell by the CLI. ``run_args``: what follows
    ``--`` on the command line, for ``${{ run.args }}``. ``variables``: per
    workflow name, ``${{ variables.NAME }}`` values (``-e NAME=…`` wins).
    ``known_secrets``: the names of the workspace's secrets (the server's
    check; None: not checked, as in the CLI, which cannot read them).
    ``resources``: keys of ``resources:`` (``OVERRIDABLE_RESOURCES``) that
    replace each workflow's own for every job of the run, written as in the
    file (``gpu: none`` takes the GPU away); ``ResourceOverrideError`` when
    one is not what the file would accept.

    1. the run's workflows: ``workflow`` and, recursively, those it names in
       ``deps: - workflow:``, dependencies first (a cycle or a missing
       workflow is an error);
    2. keys not supported yet (``NOT_BUILT_YET``) are refused, for all of
       them at once;
    3. each workflow's bare env names get their inherited values and its
       commands' ``${{ run.args }}`` / ``${{ variables.NAME }}`` are
       replaced (an unset name or undefined variable is an error); the
       secrets it names (``secrets:``, ``${{ secrets.NAME }}`` in commands,
       which becomes ``${NAME}``, or as a whole env value) are its jobs'
       ``secrets``, and a name not in ``known_secrets`` is an error;
    4. each workflow's provider makes its jobs; every job of a workflow then
       ``needs`` every job of each workflow it depends on, gets the
       workflow's tag and run deps, and the env overrides (``-e``) on top of
       its env: they apply to every job of the run;
    5. job names must be unique in the run; jobs are ordered dependencies first.
    """
    order = _workflow_order(file, file.get(workflow))
    unsupported = [e for wf in order for e in _unsupported(file, wf)]
    if unsupported:
        raise WorkflowFileError(sorted(unsupported, key=lambda e: e.line or 0))
    overrides = {str(k): str(v) for k, v in env_overrides.items()}
    replaced = resource_overrides(resources or {})
    inputs = _Inputs(overrides, dict(inherited_env or {}), list(run_args), variables or {})
    jobs_of: dict[str, list[JobPlan]] = {}
    taken: dict[str, str] = {}
    count = 0
    for wf in order:
        resolved, secrets = _resolved(file, wf, inputs, known_secrets)
        if replaced:
            resolved = resolved.model_copy(update={"resources": resolved.resources.model_copy(update=replaced)})
        jobs = _plan_workflow(file, wf, resolved, overrides, secrets)
        count += len(jobs)
        if max_jobs is not None and count > max_jobs:
            raise WorkflowFileError([_too_many_jobs(file, wf, max_jobs)])
        for job in jobs:
            if job.name in taken:
                raise WorkflowFileError(
                    [
                        file.error(
                            wf,
                            "name",
                            f"the run would have two jobs named '{job.name}' (one of "
                            f"workflow '{taken[job.name]}'); rename one of the workflows",
                        )
                    ]
                )
            taken[job.name] = wf.name
        here = [d.workflow for d in wf.deps if d.workflow and "/" not in d.workflow]
        elsewhere = _unique(d.workflow for d in wf.deps if d.workflow and "/" in d.workflow)
        needs = [job.name for dep in _unique(here) for job in jobs_of[dep]]
        tags, runs = _unique(d.tag for d in wf.deps if d.tag), _unique(d.run for d in wf.deps if d.run)
        jobs_of[wf.name] = [
            replace(
                job,
                needs=_unique([*needs, *job.needs]),
                tags=_unique([*job.tags, *tags]),
                runs=_unique([*job.runs, *runs]),
                repo_workflows=_unique([*job.repo_workflows, *elsewhere]),
            )
            for job in jobs
        ]
    return RunPlan(workflow=workflow, jobs=[job for wf in order for job in jobs_of[wf.name]])


def run_workflows(file: WorkflowsFile, workflow: str) -> list[Workflow]:
    """The workflows a run of ``workflow`` has, dependencies first."""
    return _workflow_order(file, file.get(workflow))


def inherited_env_names(file: WorkflowsFile, workflow: str) -> list[str]:
    """The bare ``env`` names of a run's workflows: what the CLI takes from its shell."""
    return _unique(name for wf in run_workflows(file, workflow) for name in wf.inherited_env)


# The keys of ``resources:`` a run may replace for all its jobs (``trainyard run --gpu …``).
OVERRIDABLE_RESOURCES = ("gpu", "cpu", "memory", "disk")


class ResourceOverrideError(ValueError):
    """A resource override the workflows file would refuse; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def resource_overrides(values: Mapping[str, object]) -> dict[str, object]:
    """``values`` (``{"gpu": "A10G:2", "memory": "16GB", …}``) checked as the
    file's ``resources:`` keys are, as the fields they replace: a size in
    bytes, a GPU spec, or None for ``gpu: none`` (no GPU)."""
    unknown = sorted(set(values) - set(OVERRIDABLE_RESOURCES))
    if unknown:
        known = ", ".join(OVERRIDABLE_RESOURCES)
        raise ResourceOverrideError(unknown[0], f"not a resource a run can override; these are: {known}")
    without_gpu = isinstance(values.get("gpu"), str) and str(values["gpu"]).strip().lower() in ("none", "0")
    checked = {k: v for k, v in values.items() if not (k == "gpu" and without_gpu)}
    if isinstance(checked.get("gpu"), str) and str(checked["gpu"]).isdigit():
        checked["gpu"] = int(str(checked["gpu"]))  # a count, as `gpu: 2` in the file
    try:
        parsed = Resources.model_validate(checked)
    except ValidationError as e:
        error = e.errors()[0]
        key = str(error["loc"][0]) if error["loc"] else "resources"
        raise ResourceOverrideError(key, error["msg"]) from None
    replaced: dict[str, object] = {k: getattr(parsed, k) for k in checked}
    if without_gpu:
        replaced["gpu"] = None
    return replaced


# ---------------------------------------------------------------- helpers


def _too_many_jobs(file: WorkflowsFile, wf: Workflow, limit: int) -> WorkflowError:
    """A run over the jobs limit, placed at ``wf``, whose jobs went past it."""
    return file.error(
        wf,
        "name",
        f"the run would have more than {limit} jobs: at most {limit} per run (TRAINYARD_MAX_JOBS_PER_RUN "
        "on the server); split the work into several runs",
    )


@dataclass(frozen=True)
class _Inputs:
    overrides: dict[str, str]
    inherited: dict[str, str]
    run_args: list[str]
    variables: Mapping[str, Mapping[str, str]]


def _resolved(
    file: WorkflowsFile, wf: Workflow, inputs: _Inputs, known_secrets: Collection[str] | None
) -> tuple[Workflow, dict[str, str]]:
    """``wf`` with its bare env names filled in and its commands' ``${{ … }}``
    replaced, and the secrets it names ({variable: secret name}); errors at
    the env item, command or ``secrets`` item that cannot be."""
    errors: list[WorkflowError] = []
    named = _Named(file, wf, known_secrets, errors)
    for index, name in enumerate(wf.secrets):
        named.add(name, name, ("secrets", index))
    env: dict[str, str] = {}
    for name, value in wf.env.items():
        if value is None and name not in inputs.inherited and name not in inputs.overrides:
            message = f"'{name}' takes its value from the shell that runs trainyard, where it is not set"
            errors.append(file.error(wf, file.env_key(wf, name), message))
        secret = _SECRET_VALUE.fullmatch(value or "")
        if secret is not None:
            named.add(name, secret.group(1), file.env_key(wf, name))
            continue
        if value is not None and "secrets." in value and _EXPRESSION.search(value):
            message = f"a secret is a whole env value: write {name}: ${{{{ secrets.NAME }}}} (no other text)"
            errors.append(file.error(wf, file.env_key(wf, name), message))
        env[name] = inputs.inherited.get(name, "") if value is None else value
    values = {**inputs.variables.get(wf.name, {}), **inputs.overrides}
    commands = [
        _substitute(file, wf, i, c, inputs.run_args, values, errors, named) for i, c in enumerate(wf.commands or [])
    ]
    for variable in named.secrets:
        if variable in env:
            message = f"'{variable}' is both a value here and a secret the workflow names: rename one of them"
            errors.append(file.error(wf, file.env_key(wf, variable), message))
    if errors:
        raise WorkflowFileError(errors)
    resolved = wf.model_copy(update={"env": env, "commands": commands if wf.commands is not None else None})
    return resolved, named.secrets


@dataclass
class _Named:
    """The secrets a workflow names, checked against the workspace's."""

    file: WorkflowsFile
    wf: Workflow
    known: Collection[str] | None
    errors: list[WorkflowError]
    secrets: dict[str, str] = field(default_factory=dict)

    def add(self, variable: str, secret: str, loc: str | _Loc) -> None:
        if self.known is not None and secret not in self.known:
            self.errors.append(self.file.error(self.wf, loc, _unknown_secret(secret, self.known)))
        self.secrets[variable] = secret


def _unknown_secret(name: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return (
        f"secret '{name}' is not set in this workspace; {hint}a workspace admin sets it with"
        f" `trainyard secrets set {name}`"
    )


def _substitute(
    file: WorkflowsFile,
    wf: Workflow,
    index: int,
    command: str,
    run_args: list[str],
    values: Mapping[str, str],
    errors: list[WorkflowError],
    named: _Named,
) -> str:
    def one(match: re.Match[str]) -> str:
        expression = match.group(1)
        if expression == "run.args":
            return shlex.join(run_args)
        secret = _SECRET.fullmatch(expression)
        if secret:
            # The value is the job's variable of that name, never planned.
            named.add(secret.group(1), secret.group(1), ("commands", index))
            return "${" + secret.group(1) + "}"
        variable = _VARIABLE.fullmatch(expression)
        if variable and variable.group(1) in values:
            return values[variable.group(1)]
        message = (
            f"undefined variable '{variable.group(1)}': define it in .trainyard/variables.yaml or pass -e "
            f"{variable.group(1)}=VALUE"
            if variable
            else f"unknown expression '${{{{ {expression} }}}}'; known: ${{{{ run.args }}}}, ${{{{ variables.NAME }}}},"
            " ${{ secrets.NAME }}"
        )
        errors.append(file.error(wf, ("commands", index), message))
        return match.group(0)

    return _EXPRESSION.sub(one, command)


def _workflow_order(file: WorkflowsFile, root: Workflow) -> list[Workflow]:
    """``root`` and its workflow deps, each after its own deps (an iterative
    depth-first walk: the server plans untrusted files, so no recursion)."""
    order: list[Workflow] = []
    done: set[str] = set()
    path, pending = [root], [iter(list(_workflow_deps(file, root)))]
    while pending:
        dep = next(pending[-1], None)
        if dep is None:
            finished = path.pop()
            pending.pop()
            done.add(finished.name)
            order.append(finished)
        elif dep.name not in done:
            names = [wf.name for wf in path]
            if dep.name in names:
                cycle = [*names[names.index(dep.name) :], dep.name]
                raise WorkflowFileError([file.error(dep, "deps", f"a cycle: {' → '.join(cycle)}")])
            path.append(dep)
            pending.append(iter(list(_workflow_deps(file, dep))))
    return order


def _workflow_deps(file: WorkflowsFile, wf: Workflow) -> Iterable[Workflow]:
    for index, dep in enumerate(wf.deps):
        if dep.workflow is None or "/" in dep.workflow:  # another repo's: its latest successful run (the server)
            continue
        if dep.workflow in file.broken:
            message = f"workflow '{dep.workflow}' has errors, so this one cannot run"
            raise WorkflowFileError([file.error(wf, ("deps", index, "workflow"), message), *file.broken[dep.workflow]])
        if dep.workflow not in file.workflows:
            try:
                file.get(dep.workflow)
            except WorkflowFileError as e:
                raise WorkflowFileError([file.error(wf, ("deps", index, "workflow"), e.errors[0].message)]) from None
        yield file.workflows[dep.workflow]


def _unsupported(file: WorkflowsFile, wf: Workflow) -> list[WorkflowError]:
    keys = [
        file.error(wf, key, f"'{key}' is not supported yet; remove it from workflow '{wf.name}' to run it")
        for key in NOT_SUPPORTED_YET
        if getattr(wf, key) not in (None, [], {})
    ]
    return keys + [
        file.error(wf, loc, f"not supported yet: {what}") for where in NOT_BUILT_YET.values() for loc, what in where(wf)
    ]


def _plan_workflow(
    file: WorkflowsFile, wf: Workflow, resolved: Workflow, overrides: dict[str, str], secrets: dict[str, str]
) -> list[JobPlan]:
    """The provider's jobs of ``resolved`` (``wf`` with its env and commands
    resolved; errors are placed at ``wf``'s lines), checked, in order."""
    provider = get_provider(wf.provider)
    env = {k: v for k, v in resolved.env.items() if v is not None}
    try:
        jobs = provider.jobs(resolved, env={**env, **overrides}, options=file.options_of(wf.name))
    except ProviderError as e:
        raise WorkflowFileError([file.error(wf, "provider", str(e))]) from None
    except Exception as e:  # a plugin's bug is shown at the workflow, not as a server error
        raise WorkflowFileError(
            [file.error(wf, "provider", f"the {wf.provider} provider failed: {type(e).__name__}: {e}")]
        ) from None
    problem = _check_jobs(wf, jobs)
    ordered = _in_order(jobs) if not problem else None
    if ordered is None:
        problem = problem or f"its jobs wait for each other in a cycle ({', '.join(job.name for job in jobs)})"
        raise WorkflowFileError(
            [file.error(wf, "provider", f"the {wf.provider} provider made an invalid plan: {problem}")]
        )
    checkpoint = wf.checkpoint or ""
    policy = provider.on_interruption
    if policy not in ON_INTERRUPTION:
        raise WorkflowFileError(
            [
                file.error(
                    wf,
                    "provider",
                    f"the {wf.provider} provider's on_interruption is {policy!r}, "
                    f"not one of {', '.join(ON_INTERRUPTION)}",
                )
            ]
        )
    return [
        replace(
            job,
            workflow=wf.name,
            env={**job.env, **overrides},
            checkpoint=checkpoint,
            on_interruption=policy,
            on_server_lost=wf.on_server_lost,
            secrets=dict(secrets),
            volumes=[{"name": v.name, "path": v.path, "read_only": v.read_only} for v in wf.volumes],
            exports=wf.exports,
            **_metrics_of(wf),
            data=[item.planned() for item in wf.inputs],
        )
        for job in ordered
    ]


def _metrics_of(wf: Workflow) -> dict[str, Any]:
    """The JobPlan fields of the workflow's ``metrics:`` (every job of it reads the same)."""
    if wf.metrics is None:
        return {}
    return {
        "metrics": [{"name": p.name, "regex": p.regex} for p in wf.metrics.patterns],
        "metrics_interval": wf.metrics.interval if isinstance(wf.metrics.interval, int) else None,
        "metrics_per_minute": wf.metrics.per_minute,
    }


def _check_jobs(wf: Workflow, jobs: Any) -> str:
    """What is wrong with a provider's jobs, or ''."""
    if not isinstance(jobs, list) or not jobs or not all(isinstance(job, JobPlan) for job in jobs):
        return "expected a non-empty list of JobPlan"
    names = [job.name for job in jobs]
    for job in jobs:
        if not isinstance(job.name, str) or not _JOB_NAME.fullmatch(job.name):
            return f"job name {job.name!r} is not a name (letters, digits, '.', '_', '-')"
        if names.count(job.name) > 1:
            return f"two jobs are named '{job.name}'"
        if job.provider not in RUNNER_PROVIDERS:
            return f"job '{job.name}' has provider '{job.provider}'; a job runs as {', '.join(RUNNER_PROVIDERS)}"
        if job.provider == "docker" and not job.image:
            return f"job '{job.name}' is a docker job without an image"
        unknown = [n for n in [*job.needs, *job.after_running] if n not in names or n == job.name]
        if unknown:
            return (
                f"job '{job.name}' waits for {', '.join(repr(n) for n in unknown)}, "
                f"which is not another job of workflow '{wf.name}'"
            )
    return ""


def _in_order(jobs: list[JobPlan]) -> list[JobPlan] | None:
    """``jobs`` ordered so each comes after its needs and after_running,
    keeping the provider's order otherwise; None if they form a cycle."""
    placed: list[JobPlan] = []
    left = list(jobs)
    while left:
        names = {job.name for job in placed}
        ready = next((job for job in left if set(job.needs) | set(job.after_running) <= names), None)
        if ready is None:
            return None
        placed.append(ready)
        left.remove(ready)
    return placed


def _unique(items: Iterable[str | None]) -> list[str]:
    return list(dict.fromkeys(item for item in items if item))


# ---------------------------------------------------------------- not built yet


def _version(wf: Workflow) -> list[tuple[_Loc, str]]:
    if wf.version is None:
        return []
    pinned = {"code": "VS Code is the one on your machine, over Remote-SSH"}.get(
        wf.provider, f"{wf.provider} runs {JUPYTER_PACKAGES.get(wf.provider, '')}"
    )
    return [(("version",), f"version: {wf.version} ({pinned}); remove it to run the workflow")]


def _ssh(wf: Workflow) -> list[tuple[_Loc, str]]:
    return [(("ssh",), "ssh: true (an SSH server in the job)")] if wf.ssh else []


# Keys that parse (dstack 0.x files) but are not built at run time yet, each
# with where it is in a workflow and what it is: refused when a run uses the
# workflow ("not supported yet: …"). Remove an entry when its feature is built.
NOT_BUILT_YET: dict[str, Callable[[Workflow], list[tuple[_Loc, str]]]] = {
    "version": _version,
    "ssh": _ssh,
}

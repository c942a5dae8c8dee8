"""Providers turn a workflow into the jobs of a run; ``resolve_run_plan``
makes the whole plan of a run: every job, in dependency order.

Shared by the CLI (plans before anything is uploaded) and the server (plans
again on submit), so nothing here prints or touches a terminal.

Built in: ``bash`` (commands), ``python`` (a script, optional requirements
and Python version) and ``docker`` (an image, optional commands). A third
party publishes a provider as a ``Provider`` subclass registered under the
entry point group ``trainyard.providers``; docs/providers.md is the guide.

A job plan says what the *runner* does: its ``provider`` is ``bash``,
``python`` (bash commands the python provider generated) or ``docker``
(the commands run inside ``image``). A plugin's jobs are one of those.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from pydantic import BaseModel

from .workflows import (
    BUILTIN_PROVIDERS,
    NOT_SUPPORTED_YET,
    PROVIDER_KEYS,
    ResourceSpec,
    Workflow,
    WorkflowError,
    WorkflowFileError,
    WorkflowsFile,
    python_binary,
    resource_spec,
)

ENTRY_POINT_GROUP = "trainyard.providers"
RUNNER_PROVIDERS = ("bash", "python", "docker")
VENV = ".trainyard-venv"
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True)
class JobPlan:
    """One job of a run, as the runner will execute it.

    ``needs``: jobs of this run that must succeed first; their artifacts are
    placed in this job's working directory at the same relative paths.
    ``after_running``: jobs of this run that must be running before this one
    starts (a cluster's master); the server gives this job
    ``TRAINYARD_MASTER_HOST`` and ``TRAINYARD_MASTER_PORT`` (the first port
    of the first of them). ``tags``/``runs``: the ``deps: - tag:``/``- run:``
    of the workflow, resolved by the server.
    """

    name: str
    workflow: str
    provider: str
    commands: list[str]
    env: dict[str, str]
    artifacts: list[str]
    resources: ResourceSpec
    ports: list[int]
    needs: list[str]
    after_running: list[str]
    tags: list[str]
    runs: list[str]
    image: str = ""


@dataclass(frozen=True)
class RunPlan:
    """Every job of a run of ``workflow``, dependencies first."""

    workflow: str
    jobs: list[JobPlan] = field(default_factory=list)

    def job(self, name: str) -> JobPlan:
        return next(job for job in self.jobs if job.name == name)


class ProviderError(Exception):
    """Raised by a provider's ``jobs`` for a workflow it cannot plan; the
    message is shown at the workflow's ``provider`` line."""


class ProviderNotFound(LookupError):
    """No built-in provider and no installed plugin has this name, or the
    plugin could not be loaded; the message says which."""


class Provider(ABC):
    """Turns one workflow into one or more jobs.

    ``name``: what workflows write as ``provider:``. ``options``: a pydantic
    model (``extra="forbid"``) of the extra workflow keys this provider
    accepts, validated when the file is loaded with file:line:key errors;
    None for no extra keys. ``workflow_keys``: which of the provider-specific
    workflow keys (``commands``, ``script``, ``requirements``, ``python``,
    ``image``) it reads; the others are refused in its workflows.
    """

    name: ClassVar[str]
    options: ClassVar[type[BaseModel] | None] = None
    workflow_keys: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def jobs(self, wf: Workflow, *, env: dict[str, str], options: BaseModel | None) -> list[JobPlan]:
        """The jobs of ``wf``, each with a name unique in the workflow (the
        workflow's name for a single job; ``<workflow>-<role>`` otherwise).

        ``env`` is the workflow's env with the run's overrides applied: start
        each job's env from it. ``options`` is an instance of ``options``.
        Set ``needs``/``after_running`` only between this workflow's own
        jobs; leave ``tags``/``runs`` empty: the planner adds the workflow's
        ``deps``. Must not do I/O: it runs on the CLI's machine and again on
        the server. Raise ProviderError for a workflow that cannot be planned.
        """


def job_plan(
    wf: Workflow,
    *,
    commands: list[str],
    env: dict[str, str],
    name: str | None = None,
    provider: str = "bash",
    **fields: Any,
) -> JobPlan:
    """A JobPlan of ``wf`` with the workflow's artifacts, resources and ports,
    no dependencies, and ``fields`` (any other JobPlan field) on top."""
    defaults: dict[str, Any] = {
        "artifacts": list(wf.artifacts), "resources": resource_spec(wf.resources), "ports": list(wf.ports),
        "needs": [], "after_running": [], "tags": [], "runs": [],
    }  # fmt: skip
    return JobPlan(
        name=name or wf.name,
        workflow=wf.name,
        provider=provider,
        commands=list(commands),
        env=dict(env),
        **{**defaults, **fields},
    )


def get_provider(name: str) -> Provider:
    """The built-in provider ``name``, else the installed plugin registered
    under that name in the ``trainyard.providers`` entry point group."""
    if name in _BUILTINS:
        return _BUILTINS[name]
    return _plugin(name)


def plugin_names() -> list[str]:
    """The names of the installed plugin providers, sorted."""
    return sorted({ep.name for ep in _entry_points()} - set(_BUILTINS))


def resolve_run_plan(file: WorkflowsFile, workflow: str, *, env_overrides: dict[str, str]) -> RunPlan:
    """The plan of a run of ``workflow``; WorkflowFileError (file:line:key)
    for anything that keeps it from running.

    1. the run's workflows: ``workflow`` and, recursively, those it names in
       ``deps: - workflow:``, dependencies first (a cycle or a missing
       workflow is an error);
    2. keys not supported yet are refused, for all of them at once;
    3. each workflow's provider makes its jobs; every job of a workflow then
       ``needs`` every job of each workflow it depends on, gets the
       workflow's tag and run deps, and the env overrides (``-e``) on top of
       its env: they apply to every job of the run;
    4. job names must be unique in the run; jobs are ordered dependencies first.
    """
    order = _workflow_order(file, file.get(workflow))
    unsupported = [e for wf in order for e in _unsupported(file, wf)]
    if unsupported:
        raise WorkflowFileError(sorted(unsupported, key=lambda e: e.line or 0))
    overrides = {str(k): str(v) for k, v in env_overrides.items()}
    jobs_of: dict[str, list[JobPlan]] = {}
    taken: dict[str, str] = {}
    for wf in order:
        jobs = _plan_workflow(file, wf, overrides)
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
        needs = [job.name for dep in _unique(d.workflow for d in wf.deps if d.workflow) for job in jobs_of[dep]]
        tags, runs = _unique(d.tag for d in wf.deps if d.tag), _unique(d.run for d in wf.deps if d.run)
        jobs_of[wf.name] = [
            replace(
                job,
                needs=_unique([*needs, *job.needs]),
                tags=_unique([*job.tags, *tags]),
                runs=_unique([*job.runs, *runs]),
            )
            for job in jobs
        ]
    return RunPlan(workflow=workflow, jobs=[job for wf in order for job in jobs_of[wf.name]])


# ---------------------------------------------------------------- built-in providers


class BashProvider(Provider):
    """``commands`` under bash; ``python: "3.11"`` puts that Python first on PATH as ``python``."""

    name = "bash"
    workflow_keys = PROVIDER_KEYS["bash"]

    def jobs(self, wf: Workflow, *, env: dict[str, str], options: BaseModel | None) -> list[JobPlan]:
        setup: list[str] = []
        if wf.python:
            binary = python_binary(wf.python)
            setup = [
                _python_check(binary),
                f'mkdir -p .trainyard-bin && ln -sf "$(command -v {binary})" '
                f'.trainyard-bin/python && ln -sf "$(command -v {binary})" .trainyard-bin/python3',
                'export PATH="$PWD/.trainyard-bin:$PATH"',
            ]
        return [job_plan(wf, commands=[*setup, *(wf.commands or [])], env=env)]


class PythonProvider(Provider):
    """``python <script>``; with ``requirements``, in a fresh virtual
    environment (the runner sets PIP_CACHE_DIR, so wheels are reused between
    jobs on the same machine); with ``python: "3.11"``, that interpreter."""

    name = "python"
    workflow_keys = PROVIDER_KEYS["python"]

    def jobs(self, wf: Workflow, *, env: dict[str, str], options: BaseModel | None) -> list[JobPlan]:
        return [
            job_plan(
                wf,
                commands=python_commands(script=wf.script or "", requirements=wf.requirements, version=wf.python),
                env=env,
                provider="python",
            )
        ]


class DockerProvider(Provider):
    """``commands`` inside ``image`` (the image's own command without
    commands); the runner needs a Docker engine and fails the job without one."""

    name = "docker"
    workflow_keys = PROVIDER_KEYS["docker"]

    def jobs(self, wf: Workflow, *, env: dict[str, str], options: BaseModel | None) -> list[JobPlan]:
        return [job_plan(wf, commands=list(wf.commands or []), env=env, provider="docker", image=wf.image or "")]


def python_commands(*, script: str, requirements: str | None, version: str | None) -> list[str]:
    """The bash commands that run ``script`` as the python provider does."""
    binary = python_binary(version) if version else "python"
    check = [_python_check(binary)] if version else []
    if not requirements:
        return [*check, f"{binary} {shlex.quote(script)}"]
    return [
        *check,
        f"{binary} -m venv {VENV}",
        f". {VENV}/bin/activate",
        f"pip install --disable-pip-version-check -r {shlex.quote(requirements)}",
        f"python {shlex.quote(script)}",
    ]


_BUILTINS: dict[str, Provider] = {p.name: p for p in (BashProvider(), PythonProvider(), DockerProvider())}
assert tuple(_BUILTINS) == BUILTIN_PROVIDERS


# ---------------------------------------------------------------- helpers


def _python_check(binary: str) -> str:
    version = binary.removeprefix("python")
    return (
        f"command -v {binary} >/dev/null || "
        f'{{ echo "python {version} is not installed on this runner\'s machine" >&2; exit 127; }}'
    )


@functools.cache
def _entry_points() -> tuple[importlib.metadata.EntryPoint, ...]:
    # Cached: scanning installed distributions costs milliseconds, and a newly
    # installed plugin needs a restart of the server anyway.
    return tuple(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


@functools.cache
def _plugin(name: str) -> Provider:
    found = [ep for ep in _entry_points() if ep.name == name]
    if not found:
        raise ProviderNotFound(_unknown_provider(name))
    entry = found[0]
    try:
        loaded = entry.load()
    except Exception as e:  # a broken plugin must not take the file (or the server) down with a traceback
        raise ProviderNotFound(
            f"provider '{name}' is installed ({entry.value}) but could not be loaded: {type(e).__name__}: {e}"
        ) from None
    provider = loaded() if isinstance(loaded, type) and issubclass(loaded, Provider) else loaded
    if not isinstance(provider, Provider):
        raise ProviderNotFound(f"provider '{name}' ({entry.value}) is not a trainyard.providers.Provider subclass")
    if getattr(provider, "name", None) != name:
        raise ProviderNotFound(
            f"provider '{name}' ({entry.value}) calls itself '{getattr(provider, 'name', None)}'; "
            "the entry point name and Provider.name must match"
        )
    return provider


def _unknown_provider(name: str) -> str:
    plugins = plugin_names()
    close = difflib.get_close_matches(name, [*BUILTIN_PROVIDERS, *plugins], n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    installed = (
        f"; installed plugin providers: {', '.join(plugins)}" if plugins else "; no plugin provider is installed"
    )
    return f"unknown provider '{name}'; {hint}the built-in providers are {', '.join(BUILTIN_PROVIDERS)}{installed}"


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
        if dep.workflow is None:
            continue
        if dep.workflow not in file.workflows:
            try:
                file.get(dep.workflow)
            except WorkflowFileError as e:
                raise WorkflowFileError([file.error(wf, ("deps", index, "workflow"), e.errors[0].message)]) from None
        yield file.workflows[dep.workflow]


def _unsupported(file: WorkflowsFile, wf: Workflow) -> list[WorkflowError]:
    return [
        file.error(wf, key, f"'{key}' is not supported yet; remove it from workflow '{wf.name}' to run it")
        for key in NOT_SUPPORTED_YET
        if getattr(wf, key) not in (None, [], {})
    ]


def _plan_workflow(file: WorkflowsFile, wf: Workflow, overrides: dict[str, str]) -> list[JobPlan]:
    """The provider's jobs of ``wf``, checked, with the overrides, in order."""
    provider = get_provider(wf.provider)
    try:
        jobs = provider.jobs(wf, env={**wf.env, **overrides}, options=file.options_of(wf.name))
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
    return [replace(job, workflow=wf.name, env={**job.env, **overrides}) for job in ordered]


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

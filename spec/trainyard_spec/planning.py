"""The plan of a run: every job, in dependency order (``resolve_run_plan``).

Shared by the CLI (plans before anything is uploaded) and the server (plans
again on submit), so nothing here prints or touches a terminal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from .providers import RUNNER_PROVIDERS, JobPlan, ProviderError, get_provider
from .schema import NOT_SUPPORTED_YET, Workflow, WorkflowError, WorkflowFileError
from .workflows import WorkflowsFile

_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
ON_INTERRUPTION = ("restart_group", "job")


@dataclass(frozen=True)
class RunPlan:
    """Every job of a run of ``workflow``, dependencies first."""

    workflow: str
    jobs: list[JobPlan] = field(default_factory=list)

    def job(self, name: str) -> JobPlan:
        return next(job for job in self.jobs if job.name == name)


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


# ---------------------------------------------------------------- helpers


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
        replace(job, workflow=wf.name, env={**job.env, **overrides}, checkpoint=checkpoint, on_interruption=policy)
        for job in ordered
    ]


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

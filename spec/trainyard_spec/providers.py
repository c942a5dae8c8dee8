"""The provider SDK: a provider turns a workflow into the jobs of a run.

Built in: ``bash`` (commands), ``python`` (a script, optional requirements
and Python version) and ``docker`` (an image, optional commands). A third
party publishes a provider as a ``Provider`` subclass registered under the
entry point group ``trainyard.providers``; docs/providers.md is the guide.

A job plan says what the *runner* does: its ``provider`` is ``bash``,
``python`` (bash commands the python provider generated) or ``docker``
(the commands run inside ``image``). A plugin's jobs are one of those.

This module knows workflows (``schema``) but not files: ``workflows`` loads a
file and looks its providers up here, ``planning`` makes the plan of a run.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

from .schema import (
    BUILTIN_PROVIDERS,
    DEV_ENVIRONMENT_PROVIDERS,
    PROVIDER_KEYS,
    EnvironmentSpec,
    ResourceSpec,
    Workflow,
    python_binary,
    resource_spec,
)

ENTRY_POINT_GROUP = "trainyard.providers"
# What a job plan's provider may be: what the runner knows how to execute.
RUNNER_PROVIDERS = ("bash", "python", "docker")
VENV = ".trainyard-venv"
# What a lab or notebook job's environment gets besides the workflow's own:
# pinned, so every job of a workflow builds (and then reuses) one environment.
JUPYTER_PACKAGES = {"lab": "jupyterlab==4.6.6", "notebook": "notebook==7.6.5"}
# The variable the server's per-job token reaches a Jupyter job in (Jupyter reads it).
JUPYTER_TOKEN_VARIABLE = "JUPYTER_TOKEN"


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
    # The workflow's ``checkpoint:`` path (every job of the workflow syncs its own); "" when none.
    checkpoint: str = ""
    # When this job is interrupted (spot, a lost machine) and it runs with
    # others (``after_running``: a master and its workers): "restart_group"
    # stops the rest of its group too, so all resume together from their
    # checkpoints and the workers get the new master's address; "job" retries
    # this job alone. The planner sets it from ``Provider.on_interruption``.
    on_interruption: str = "restart_group"
    # The workflow's ``on_server_lost``: "stop" (the runner stops the job when
    # it has lost the server for longer than the unreachable grace, so the
    # server's retry elsewhere is the only copy) or "keep-running".
    on_server_lost: str = "stop"
    # ``deps: - workflow: owner/repo/name``: the artifacts of the latest
    # successful run of that workflow of another repo of the workspace (the
    # server resolves it at submission).
    repo_workflows: list[str] = field(default_factory=list)
    # From dstack 0.x files: ``ports: N`` (N free ports, PORT_0 … PORT_{N-1}),
    # artifacts with ``mount: true`` (also uploaded while the job runs) and
    # ``cache`` paths (restored before, saved after).
    port_count: int = 0
    mounts: list[str] = field(default_factory=list)
    cache: list[str] = field(default_factory=list)
    # ``environment:`` (or the python provider's ``requirements``), as the
    # runner gets it (``EnvironmentSpec.runner_spec``); None: the machine's own.
    environment: dict[str, object] | None = None
    # The workspace secrets the job gets: {environment variable: secret name}
    # (``secrets: [HF_TOKEN]`` is {"HF_TOKEN": "HF_TOKEN"}; ``TOKEN: ${{
    # secrets.HF_TOKEN }}`` in env is {"TOKEN": "HF_TOKEN"}). The planner sets
    # it; the values are fetched by the job's runner, never planned.
    secrets: dict[str, str] = field(default_factory=dict)
    # A dev environment's provider ("code", "lab", "notebook"; "" for other
    # jobs) and its ``inactivity_duration`` (seconds, "off", or None: the
    # workspace's default).
    dev_environment: str = ""
    inactivity_duration: int | str | None = None
    # The workflow's ``metrics:``: [{"name", "regex"}] searched in every log
    # line, the sampling interval (seconds; None: the runner's 5 s) and the
    # training values kept a minute (None: the runner's 600).
    metrics: list[dict[str, str]] = field(default_factory=list)
    metrics_interval: int | None = None
    metrics_per_minute: int | None = None
    # The workflow's ``inputs:``: [{"uri", "path", "read_only", "sha256"}]
    # (``InputSpec.planned``), listed by the server when the run is submitted.
    data: list[dict[str, object]] = field(default_factory=list)
    # The workflow's ``volumes:``: [{"name", "path", "read_only"}], mounted for the job.
    volumes: list[dict[str, object]] = field(default_factory=list)
    # The workflow's ``artifacts: - to:``: {artifact path: destination as
    # written, its ``${{ … }}`` unfilled}; the server copies each uploaded
    # artifact there (``schema.export_destination``).
    exports: dict[str, str] = field(default_factory=dict)


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
    ``on_interruption``: when one job of a group (a master and the jobs that
    run ``after_running`` it) is interrupted, "restart_group" (the default)
    restarts the whole group from its checkpoints, "job" retries that job
    alone.
    """

    name: ClassVar[str]
    options: ClassVar[type[BaseModel] | None] = None
    workflow_keys: ClassVar[frozenset[str]] = frozenset()
    # What an interruption of one of its jobs does to the others of their
    # group (``JobPlan.on_interruption``): "restart_group" or "job".
    on_interruption: ClassVar[str] = "restart_group"

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
        "artifacts": wf.artifact_paths, "resources": resource_spec(wf.resources), "ports": list(wf.ports.numbers),
        "needs": [], "after_running": [], "tags": [], "runs": [], "port_count": wf.ports.count,
        "mounts": [a.path for a in wf.artifacts if a.mount], "cache": [c.path for c in wf.cache],
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


# ---------------------------------------------------------------- built-in providers


class BashProvider(Provider):
    """``commands`` under bash; ``python: "3.11"`` puts that Python first on PATH as ``python``."""

    name = "bash"
    workflow_keys = PROVIDER_KEYS["bash"]

    def jobs(self, wf: Workflow, *, env: dict[str, str], options: BaseModel | None) -> list[JobPlan]:
        environment = environment_of(wf)
        if environment is not None:
            # The environment's interpreter is first on PATH as python and python3.
            return [job_plan(wf, commands=list(wf.commands or []), env=env, environment=environment)]
        setup: list[str] = []
        if wf.python:
            binary = python_binary(wf.python)
            # The interpreter itself, not what is on PATH under its name: a
            # pyenv shim linked as "python" runs pyenv's default version.
            real = f"$({binary} -c 'import sys; print(sys.executable)')"
            setup = [
                _python_check(binary),
                f'mkdir -p .trainyard-bin && ln -sf "{real}" .trainyard-bin/python'
                f' && ln -sf "{real}" .trainyard-bin/python3',
                'export PATH="$PWD/.trainyard-bin:$PATH"',
            ]
        return [job_plan(wf, commands=[*setup, *(wf.commands or [])], env=env)]


class PythonProvider(Provider):
    """``python <script>``; with ``requirements`` (or ``environment:``), in
    the environment the runner builds once for them and reuses
    (docs/ENVIRONMENTS.md); with ``python: "3.11"``, that interpreter."""

    name = "python"
    workflow_keys = PROVIDER_KEYS["python"]

    def jobs(self, wf: Workflow, *, env: dict[str, str], options: BaseModel | None) -> list[JobPlan]:
        environment = environment_of(wf, requirements=wf.requirements)
        if environment is not None:
            commands = [f"python {shlex.quote(wf.script or '')}"]
            return [job_plan(wf, commands=commands, env=env, provider="python", environment=environment)]
        return [
            job_plan(
                wf,
                commands=python_commands(script=wf.script or "", requirements=None, version=wf.python),
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


def environment_of(wf: Workflow, *, requirements: str | None = None) -> dict[str, object] | None:
    """The job's ``environment`` (``AssignJob.environment``): the workflow's
    ``environment:``, with its ``python`` (and the python provider's
    ``requirements``) as shorthand; None when it has none."""
    spec = wf.environment
    if spec is None and requirements is None:
        return None
    if spec is not None and wf.python and spec.python and spec.python != wf.python:
        raise ProviderError(f"python: {wf.python!r} and environment: python: {spec.python!r} differ; keep one of them")
    if spec is not None and requirements and spec.requirements and spec.requirements != requirements:
        raise ProviderError(
            f"requirements: {requirements!r} and environment: requirements: {spec.requirements!r} differ;"
            " keep one of them"
        )
    return (spec or EnvironmentSpec()).runner_spec(python=wf.python, requirements=requirements)


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


class DevEnvironmentProvider(Provider, ABC):
    """dstack 0.x's ``code``, ``lab`` and ``notebook``: one job that stays up
    until it is stopped or idle for its ``inactivity_duration``
    (docs/decisions/0104-dev-environments.md). Its ``setup`` commands run
    first, in the workflow's environment (``environment:``, ``python``,
    ``requirements``) when it has one."""

    workflow_keys = PROVIDER_KEYS["code"]
    # Whether it serves an app on PORT_0 (Jupyter) or only stays up (code).
    app: ClassVar[bool] = False

    def jobs(self, wf: Workflow, *, env: dict[str, str], options: BaseModel | None) -> list[JobPlan]:
        environment = self.environment(wf)
        commands = [*(wf.setup or []), *self.commands(wf)]
        return [
            job_plan(
                wf,
                commands=commands,
                env=env,
                environment=environment,
                # The app's port is PORT_0; the workflow's own ``ports: N`` follow it.
                port_count=wf.ports.count + (1 if self.app else 0),
                dev_environment=self.name,
                inactivity_duration=wf.inactivity_duration,
            )
        ]

    def environment(self, wf: Workflow) -> dict[str, object] | None:
        """The workflow's environment; ``python:`` alone is one too (a dev
        environment runs in an environment of that Python, not beside it)."""
        return environment_of(wf, requirements=wf.requirements) or ({"python": wf.python} if wf.python else None)

    @abstractmethod
    def commands(self, wf: Workflow) -> list[str]:
        """What runs after the ``setup`` commands, for as long as the job runs."""


class CodeProvider(DevEnvironmentProvider):
    """A machine that stays up in the workflow's environment, for VS Code's
    Remote-SSH (``trainyard ssh-config``)."""

    name = "code"

    def commands(self, wf: Workflow) -> list[str]:
        # TRAINYARD_SSH_HOST: the job's ``ssh-config`` host (the server sets it for a dev environment).
        return [
            'echo "Ready for VS Code over SSH: trainyard ssh-config $TRAINYARD_RUN_NAME, then:'
            ' code --remote ssh-remote+$TRAINYARD_SSH_HOST $PWD"',
            "exec sleep infinity",
        ]


class JupyterProvider(DevEnvironmentProvider, ABC):
    """JupyterLab or Jupyter Notebook on 127.0.0.1:$PORT_0, installed into
    the workflow's environment (``JUPYTER_PACKAGES``, pinned), with the token
    the server made for the job (``JUPYTER_TOKEN``, delivered with its
    secrets) and idle kernels culled after ``inactivity_duration``."""

    app = True
    command: ClassVar[str]

    def environment(self, wf: Workflow) -> dict[str, object] | None:
        spec = super().environment(wf) or {}
        pip = list(spec.get("pip") or [])  # type: ignore[call-overload]
        return {**spec, "pip": [*pip, JUPYTER_PACKAGES[self.name]]}

    def commands(self, wf: Workflow) -> list[str]:
        options = [
            "--no-browser",
            # A job runs as root on a machine whose runner is root without a job user.
            "--allow-root",
            "--ip=127.0.0.1",
            '--port="$PORT_0"',
            "--ServerApp.port_retries=0",
            # Reached only through the server's app proxy, whose Host is the apps origin's.
            "--ServerApp.allow_remote_access=True",
            '--ServerApp.root_dir="$PWD"',
        ]
        idle = wf.inactivity_duration
        if isinstance(idle, int):
            options += [f"--MappingKernelManager.cull_idle_timeout={idle}", "--MappingKernelManager.cull_interval=60"]
        return [f"exec jupyter {self.command} {' '.join(options)}"]


class LabProvider(JupyterProvider):
    name = "lab"
    command = "lab"


class NotebookProvider(JupyterProvider):
    name = "notebook"
    command = "notebook"


_BUILTINS: dict[str, Provider] = {p.name: p for p in (BashProvider(), PythonProvider(), DockerProvider())}
assert tuple(_BUILTINS) == BUILTIN_PROVIDERS


_BUILTINS |= {p.name: p for p in (CodeProvider(), LabProvider(), NotebookProvider())}
assert tuple(_BUILTINS)[len(BUILTIN_PROVIDERS) :] == DEV_ENVIRONMENT_PROVIDERS


# ---------------------------------------------------------------- helpers


def _python_check(binary: str) -> str:
    version = binary.removeprefix("python")
    # Run, not just found: a pyenv shim is on PATH for versions it cannot run.
    return (
        f"{binary} -c '' 2>/dev/null || "
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
            + _old_sdk_hint(e)
        ) from None
    provider = loaded() if isinstance(loaded, type) and issubclass(loaded, Provider) else loaded
    if not isinstance(provider, Provider):
        raise ProviderNotFound(f"provider '{name}' ({entry.value}) is not a trainyard_spec.Provider subclass")
    if getattr(provider, "name", None) != name:
        raise ProviderNotFound(
            f"provider '{name}' ({entry.value}) calls itself '{getattr(provider, 'name', None)}'; "
            "the entry point name and Provider.name must match"
        )
    return provider


def _old_sdk_hint(e: Exception) -> str:
    # Plugins written before the SDK left the CLI import ``trainyard.providers``,
    # which only exists where the CLI is installed (never on the server).
    if isinstance(e, ModuleNotFoundError) and (e.name or "").partition(".")[0] == "trainyard":
        return " (the provider SDK is now the trainyard-spec package: import from trainyard_spec)"
    return ""


def _unknown_provider(name: str) -> str:
    plugins = plugin_names()
    close = difflib.get_close_matches(name, [*BUILTIN_PROVIDERS, *plugins], n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    installed = (
        f"; installed plugin providers: {', '.join(plugins)}" if plugins else "; no plugin provider is installed"
    )
    return f"unknown provider '{name}'; {hint}the built-in providers are {', '.join(BUILTIN_PROVIDERS)}{installed}"

"""The workflow file: schema and validation with file/line/key errors.
``providers`` turns a validated workflow into the jobs of a run.

Shared by the CLI (validates before anything is uploaded) and the server
(validates again on submit), so nothing here prints or touches a terminal.

A file is ``.trainyard/workflows.yaml`` (or the older ``.dstack/workflows.yaml``)::

    workflows:
      - name: train
        provider: bash            # bash | python | docker
        commands: [python train.py]
        env: {STEPS: 20}
        artifacts: [./checkpoint]
        resources: {cpu: 4, memory: 16GB, gpu: {name: A100, count: 1}}

Rules the schema enforces (see ``_units`` for sizes and durations):

- every key is known; a misspelt key is an error that suggests the right one;
- ``provider`` is required; ``bash`` needs ``commands``, ``python`` needs
  ``script`` (and may have ``requirements``), ``docker`` needs ``image``;
- sizes need a unit (``512MB``, ``16GB``, ``1.5GiB``; binary units); a bare
  number is refused as ambiguous;
- ``gpu`` is a mapping ``{name, count, memory}`` or a plain count
  (``gpu: 2``); the count is at least 1;
- ``env`` values are strings, numbers or booleans and are passed on as the
  text written in the file (``VERSION: 1.10`` gives ``"1.10"``);
- artifact and checkpoint paths are relative and stay inside the repo.

- ``provider`` may also name a plugin (``trainyard.providers`` entry point,
  see ``providers``); its extra keys are validated by the plugin's
  ``options`` model, with the same file/line/key errors.

Keys whose behaviour is not built yet (``checkpoint``, ``backends``,
``regions``, ``spot_policy``, ``max_price``, ``max_wait``, ``idle_duration``,
``max_duration``, ``retry``) validate like the rest but are refused when a run
is planned (``providers.resolve_run_plan``), i.e. only when a run uses a
workflow that has them.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from . import _yamltree
from ._messages import describe, key_path, message, unknown_key
from ._units import parse_duration, parse_size

if TYPE_CHECKING:
    from .providers import Provider

WORKFLOW_FILES = (".trainyard/workflows.yaml", ".dstack/workflows.yaml")
BUILTIN_PROVIDERS = ("bash", "python", "docker")
# checkpoint is accepted: its behaviour (sync and resume after a spot
# interruption) only exists where instances can be interrupted, and the only
# backend so far (local) never is (docs/decisions/0007-checkpoint-accepted.md).
NOT_SUPPORTED_YET = (
    "backends", "regions", "spot_policy", "max_price",
    "max_wait", "idle_duration", "max_duration",
)  # fmt: skip


@dataclass(frozen=True)
class WorkflowError:
    """One problem in a workflow file. ``line`` is 1-based, None if unknown."""

    file: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.key}: {self.message}"


class WorkflowFileError(Exception):
    """A workflow file (or the use of one of its workflows) is invalid."""

    def __init__(self, errors: list[WorkflowError]) -> None:
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class ResourceSpec:
    cpu: int | None
    memory_bytes: int | None
    disk_bytes: int | None
    shm_size_bytes: int | None
    gpu_name: str | None
    gpu_count: int
    gpu_memory_bytes: int | None


@dataclass(frozen=True)
class JobSpec:
    workflow: str
    commands: list[str]
    env: dict[str, str]
    artifacts: list[str]
    resources: ResourceSpec
    provider: str


# ---------------------------------------------------------------- schema


def _gpu_count(value: int) -> int:
    if value < 1:
        raise PydanticCustomError(
            "gpu_count",
            "a gpu count must be at least 1, got {value} (to run without a GPU, leave out gpu)",
            {"value": value},
        )
    return value


def _gpu_shorthand(value: object) -> object:
    return {"count": value} if isinstance(value, int) and not isinstance(value, bool) else value


def _env_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise PydanticCustomError(
        "env_value", "an env value must be a string, number or boolean, got {got}", {"got": describe(value)}
    )


def _relative_path(value: str) -> str:
    path = PurePosixPath(value)
    if not value.strip() or path.is_absolute() or ".." in path.parts:
        raise PydanticCustomError(
            "rel_path", "expected a path inside the repository such as ./checkpoint, got '{value}'", {"value": value}
        )
    return value


def _name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", value):
        raise PydanticCustomError(
            "name",
            "a workflow name uses letters, digits, '.', '_' and '-' and starts with a letter or digit, got '{value}'",
            {"value": value},
        )
    return value


def _python_version(value: object) -> object:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise PydanticCustomError(
            "python_version",
            'write the Python version as a string, e.g. python: "3.11" (3.10 unquoted is the number 3.1)',
        )
    return value


def _python_version_text(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"3(\.\d+){0,2}", value):
        raise PydanticCustomError(
            "python_version", "expected a Python 3 version such as \"3.11\", got '{value}'", {"value": value}
        )
    return value


def python_binary(version: str) -> str:
    """``python3.11`` for ``"3.11"`` (and ``"3.11.4"``: a patch level has no binary of its own)."""
    return "python" + ".".join(version.split(".")[:2])


def _retry_shorthand(value: object) -> object:
    """``retry: true`` is the defaults; ``retry: false`` is a single attempt."""
    if value is True:
        return {}
    return {"on_events": [], "limit": 1} if value is False else value


def _event_name(value: object) -> object:
    return value.replace("-", "_") if isinstance(value, str) else value


def _port(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
        return value
    raise PydanticCustomError("port", "expected a port number from 1 to 65535, got {got}", {"got": describe(value)})


_Str = Annotated[str, Field(strict=True)]
_Count = Annotated[int, Field(strict=True, ge=1)]
_Size = Annotated[int, BeforeValidator(parse_size)]
_Duration = Annotated[int | str, BeforeValidator(parse_duration)]
_RelPath = Annotated[_Str, AfterValidator(_relative_path)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_M = TypeVar("_M", bound=BaseModel)


class GpuSpec(_Model):
    name: _Str | None = None
    count: Annotated[int, Field(strict=True), AfterValidator(_gpu_count)] = 1
    memory: _Size | None = None


class Resources(_Model):
    cpu: _Count | None = None
    memory: _Size | None = None
    disk: _Size | None = None
    shm_size: _Size | None = None
    gpu: Annotated[GpuSpec | None, BeforeValidator(_gpu_shorthand)] = None


class Dep(_Model):
    workflow: _Str | None = None
    tag: _Str | None = None
    run: _Str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Dep:
        if sum(v is not None for v in (self.workflow, self.tag, self.run)) != 1:
            raise PydanticCustomError("dep", "a dependency names exactly one of workflow, tag or run")
        return self


RetryEvent = Literal["interruption", "instance_lost", "error", "no_capacity"]


class Retry(_Model):
    """Which ended attempts are tried again (docs/RUNS.md, "Retries").
    Absent: ``interruption`` and ``instance_lost``, 5 attempts, within 1h."""

    on_events: list[Annotated[RetryEvent, BeforeValidator(_event_name)]] | None = None
    limit: Annotated[int, Field(strict=True, ge=1)] | None = None
    duration: _Duration | None = None

    def policy(self) -> dict[str, object]:
        """What the server stores on each job (None fields left to the defaults)."""
        duration = self.duration if isinstance(self.duration, int) else None
        values = {"on_events": self.on_events, "limit": self.limit, "duration": duration}
        return {k: v for k, v in values.items() if v is not None}


class Workflow(_Model):
    name: Annotated[_Str, AfterValidator(_name)]
    provider: _Str
    commands: list[_Str] | None = None
    script: _Str | None = None
    requirements: _Str | None = None
    python: Annotated[_Str | None, BeforeValidator(_python_version), AfterValidator(_python_version_text)] = None
    image: _Str | None = None
    env: dict[str, Annotated[str, BeforeValidator(_env_value)]] = Field(default_factory=dict)
    ports: list[Annotated[int, BeforeValidator(_port)]] = Field(default_factory=list)
    artifacts: list[_RelPath] = Field(default_factory=list)
    deps: list[Dep] = Field(default_factory=list)
    checkpoint: _RelPath | None = None
    resources: Resources = Field(default_factory=Resources)
    backends: list[_Str] | None = None
    regions: list[_Str] | None = None
    spot_policy: Literal["spot", "on-demand", "auto"] | None = None
    max_price: Annotated[float, Field(gt=0)] | None = None
    max_wait: _Duration | None = None
    idle_duration: _Duration | None = None
    max_duration: _Duration | None = None
    retry: Annotated[Retry | None, BeforeValidator(_retry_shorthand)] = None


# The keys only some providers read; a plugin declares the ones it reads
# (``Provider.workflow_keys``), the rest are refused in its workflows.
PROVIDER_KEYS: dict[str, frozenset[str]] = {
    "bash": frozenset({"commands", "python"}),
    "python": frozenset({"script", "requirements", "python"}),
    "docker": frozenset({"image", "commands"}),
}
PROVIDER_SPECIFIC_KEYS = frozenset().union(*PROVIDER_KEYS.values())
_PROVIDER_REQUIRED = {
    "bash": ("commands", "a list of shell commands"),
    "python": ("script", "the Python file to run"),
    "docker": ("image", "the container image"),
}


# ---------------------------------------------------------------- the file


class WorkflowsFile:
    """A validated file. ``workflows`` keeps the file's order."""

    def __init__(
        self,
        *,
        path: str,
        workflows: dict[str, Workflow],
        tree: _yamltree.Tree,
        options: dict[str, BaseModel] | None = None,
    ) -> None:
        self.path = path
        self.workflows = workflows
        self._tree = tree
        self._index = {name: i for i, name in enumerate(workflows)}
        self._options = options or {}

    def options_of(self, name: str) -> BaseModel | None:
        """The validated plugin options of workflow ``name`` (None for built-in providers)."""
        return self._options.get(name)

    def get(self, name: str) -> Workflow:
        """The workflow called ``name``; WorkflowFileError listing the names if none."""
        if name in self.workflows:
            return self.workflows[name]
        close = difflib.get_close_matches(name, list(self.workflows), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        message = f"no workflow named '{name}'; {hint}the file has: {', '.join(self.workflows) or 'none'}"
        raise WorkflowFileError([WorkflowError(self.path, None, "workflows", message)])

    def error(self, workflow: Workflow, key: str | tuple[str | int, ...], message: str) -> WorkflowError:
        """An error about ``key`` of ``workflow`` (a key, or a path such as
        ``("deps", 0, "workflow")``), placed at that key's line."""
        loc = (key,) if isinstance(key, str) else key
        index = self._index.get(workflow.name)
        if index is None or self.workflows.get(workflow.name) is not workflow:
            return WorkflowError(self.path, None, key_path(loc, None, prefix=workflow.name), message)
        path = ("workflows", index, *loc)
        return WorkflowError(self.path, self._tree.line_of(path), key_path(path, self._tree.data), message)


def find_workflows_file(root: Path) -> Path:
    """The first of WORKFLOW_FILES that exists under ``root``."""
    for name in WORKFLOW_FILES:
        if (root / name).is_file():
            return root / name
    message = f"no workflows file: create {WORKFLOW_FILES[0]} (or {WORKFLOW_FILES[1]}) with a 'workflows:' list"
    raise WorkflowFileError([WorkflowError(str(root), None, "workflows", message)])


def load_workflows_file(text: str, *, path: str) -> WorkflowsFile:
    """Parse and validate a whole file; WorkflowFileError lists every problem.

    1. YAML syntax (a syntax error stops here, with the line of the mark);
    2. the top level: a mapping with a ``workflows`` list and nothing else;
    3. each workflow against the pydantic schema, errors mapped to lines;
    4. per valid workflow: unique name, known provider, provider's keys.
    """
    try:
        tree = _yamltree.parse_checked(text)
    except yaml.MarkedYAMLError as e:
        raise WorkflowFileError([_yaml_error(e, path)]) from None
    errors = [WorkflowError(path, e.line, key_path(e.path, tree.data) or "(top level)", e.message) for e in tree.errors]
    items = _top_level(tree, path, errors)
    workflows: dict[str, Workflow] = {}
    options: dict[str, BaseModel] = {}
    for index, item in enumerate(items):
        workflow, workflow_options = _validate_workflow(item, index, tree, path, errors)
        if workflow is not None:
            _check_workflow(workflow, index, tree, path, workflows, errors)
            if workflow_options is not None and workflows.get(workflow.name) is workflow:
                options[workflow.name] = workflow_options
    if errors:
        raise WorkflowFileError(sorted(errors, key=lambda e: e.line or 0))
    return WorkflowsFile(path=path, workflows=workflows, tree=tree, options=options)


def resolve_job_spec(wf: Workflow, *, file: WorkflowsFile, env_overrides: dict[str, str]) -> JobSpec:
    """The single job a run of ``wf`` executes, for callers that do not take
    run plans yet; ``providers.resolve_run_plan`` is the full answer.

    Refuses (WorkflowFileError) what ``resolve_run_plan`` refuses, and what a
    JobSpec cannot carry: a run of several jobs, ``deps: - tag/run``, ports
    and container images.
    """
    from .providers import resolve_run_plan  # providers imports this module

    plan = resolve_run_plan(file, wf.name, env_overrides=env_overrides)
    job = plan.jobs[-1]
    lost = [
        what
        for what, present in (
            ("more than one job", len(plan.jobs) > 1),
            ("tag or run dependencies", job.tags or job.runs),
            ("ports", job.ports),
            ("a container image", job.image),
        )
        if present
    ]
    if lost:
        message = (
            f"workflow '{wf.name}' needs {' and '.join(lost)}, which "
            "this server cannot run yet (it takes single jobs only)"
        )
        raise WorkflowFileError([file.error(wf, "provider", message)])
    return JobSpec(
        workflow=wf.name,
        commands=list(job.commands),
        env=dict(job.env),
        artifacts=list(job.artifacts),
        resources=job.resources,
        provider=job.provider,
    )


def resource_spec(r: Resources) -> ResourceSpec:
    """The resources of a workflow, sizes in bytes."""
    gpu = r.gpu
    return ResourceSpec(
        cpu=r.cpu,
        memory_bytes=r.memory,
        disk_bytes=r.disk,
        shm_size_bytes=r.shm_size,
        gpu_name=gpu.name if gpu else None,
        gpu_count=gpu.count if gpu else 0,
        gpu_memory_bytes=gpu.memory if gpu else None,
    )


# ---------------------------------------------------------------- helpers


def _top_level(tree: _yamltree.Tree, path: str, errors: list[WorkflowError]) -> list[Any]:
    data = tree.data
    if data is None and tree.errors:
        return []  # the tree could not be built; its error says why
    if not isinstance(data, dict):
        got = "an empty file" if data is None else describe(data)
        errors.append(
            WorkflowError(
                path, tree.line_of(()) or 1, "(top level)", f"expected a mapping with a 'workflows' list, got {got}"
            )
        )
        return []
    for key in data:
        if key != "workflows":
            errors.append(WorkflowError(path, tree.lines[(key,)], key, unknown_key(key, ["workflows"])))
    items = data.get("workflows")
    if "workflows" not in data:
        errors.append(
            WorkflowError(
                path,
                tree.line_of(()),
                "workflows",
                "missing the 'workflows' list: write workflows: followed by - name: … items",
            )
        )
    elif not isinstance(items, list):
        errors.append(
            WorkflowError(
                path,
                tree.lines[("workflows",)],
                "workflows",
                f"expected a list of workflows (items starting with '- name:'), got {describe(items)}",
            )
        )
    return items if isinstance(items, list) else []


def _yaml_error(e: yaml.MarkedYAMLError, path: str) -> WorkflowError:
    mark = e.problem_mark or e.context_mark
    line = mark.line + 1 if mark else None
    message = f"invalid YAML: {e.problem or e.context}"
    if e.problem and e.context and e.context_mark and e.context_mark.line + 1 != line:
        message += f" ({e.context} started at line {e.context_mark.line + 1})"
    return WorkflowError(path, line, "yaml", message)


def _validate_workflow(
    item: Any, index: int, tree: _yamltree.Tree, path: str, errors: list[WorkflowError]
) -> tuple[Workflow | None, BaseModel | None]:
    """The workflow, and its plugin options if its provider is a plugin: keys
    that are not workflow keys go to the plugin's ``options`` model."""
    base = ("workflows", index)
    if not isinstance(item, dict):
        return _validated(Workflow, item, base, tree, path, errors), None
    if isinstance(item.get("env"), dict):
        # numbers and booleans in env are passed on as written in the file
        item = {**item, "env": {k: tree.raw.get((*base, "env", k), v) for k, v in item["env"].items()}}
    provider = item.get("provider")
    if not isinstance(provider, str) or provider in BUILTIN_PROVIDERS:
        return _validated(Workflow, item, base, tree, path, errors), None
    extras = {k: v for k, v in item.items() if k not in Workflow.model_fields}
    workflow = _validated(Workflow, {k: v for k, v in item.items() if k not in extras}, base, tree, path, errors)
    plugin = _plugin(provider)
    if plugin is None:
        return workflow, None  # _check_workflow says the provider is unknown
    if plugin.options is None:
        for key in extras:
            loc = (*base, key)
            errors.append(
                WorkflowError(
                    path,
                    tree.line_of(loc),
                    key_path(loc, tree.data),
                    unknown_key(key, list(Workflow.model_fields)) + f" (the {provider} provider takes no options)",
                )
            )
        return workflow, None
    return workflow, _validated(plugin.options, extras, base, tree, path, errors)


def _validated(
    model: type[_M],
    item: Any,
    base: tuple[str | int, ...],
    tree: _yamltree.Tree,
    path: str,
    errors: list[WorkflowError],
) -> _M | None:
    try:
        return model.model_validate(item)
    except ValidationError as e:
        for err in e.errors(include_url=False):
            loc = (*base, *err["loc"])
            beside = None if model is Workflow else list(Workflow.model_fields)
            errors.append(
                WorkflowError(path, tree.line_of(loc), key_path(loc, tree.data), message(err, model, beside=beside))
            )
        return None


def _plugin(name: str) -> Provider | None:
    from .providers import ProviderNotFound, get_provider  # providers imports this module

    try:
        return get_provider(name)
    except ProviderNotFound:
        return None


def _check_workflow(
    wf: Workflow, index: int, tree: _yamltree.Tree, path: str, seen: dict[str, Workflow], errors: list[WorkflowError]
) -> None:
    from .providers import ProviderNotFound, get_provider  # providers imports this module

    def add(key: str, message: str) -> None:
        loc = ("workflows", index, key)
        errors.append(WorkflowError(path, tree.line_of(loc), key_path(loc, tree.data), message))

    if wf.name in seen:
        add(
            "name",
            f"duplicate workflow name '{wf.name}' (first at line "
            f"{tree.line_of(('workflows', list(seen).index(wf.name), 'name'))})",
        )
    else:
        seen[wf.name] = wf
    try:
        provider = get_provider(wf.provider)
    except ProviderNotFound as e:
        add("provider", str(e))
        return
    if wf.provider in _PROVIDER_REQUIRED:
        required, what = _PROVIDER_REQUIRED[wf.provider]
        if getattr(wf, required) in (None, []):
            add("provider", f"the {wf.provider} provider needs '{required}' ({what})")
    for key in sorted(PROVIDER_SPECIFIC_KEYS - provider.workflow_keys):
        if getattr(wf, key) is not None:
            add(key, _not_for(key, wf.provider))


def _not_for(key: str, provider: str) -> str:
    users = [p for p, keys in PROVIDER_KEYS.items() if key in keys]
    if provider in BUILTIN_PROVIDERS:
        return f"'{key}' is for the {' and '.join(users)} provider, not {provider}"
    return f"'{key}' is not used by the {provider} provider"

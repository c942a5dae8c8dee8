"""The keys of a workflow: the pydantic schema, the resource sizes in bytes,
and the errors a workflow file can have (file, line, key, message).

Pure data and validation: no file is read and no provider is looked up here
(``workflows`` loads a file, ``providers`` turns a workflow into jobs,
``planning`` makes a run's plan), so every other module can import this one.

Rules the schema enforces (see ``_units`` for sizes and durations):

- every key is known; a misspelt key is an error that suggests the right one;
- sizes need a unit (``512MB``, ``16GB``, ``1.5GiB``; binary units); a bare
  number is refused as ambiguous;
- ``gpu`` is a mapping ``{name, count, memory}``, a plain count
  (``gpu: 2``) or ``NAME[:COUNT]`` (``gpu: A100``, ``gpu: A100:2``, also as
  the mapping's name); the count is at least 1. The name is matched on the
  server by exact model (docs/WORKFLOWS.md, GPU names);
- ``env`` values are strings, numbers or booleans and are passed on as the
  text written in the file (``VERSION: 1.10`` gives ``"1.10"``);
- ``secrets`` names workspace secrets (environment variable names); a job
  gets only the secrets its workflow names (docs/WORKFLOWS.md, Secrets);
- artifact and checkpoint paths are relative and stay inside the repo;
- placement (``backends``, ``regions``, ``spot_policy``, ``max_price``,
  ``max_wait``, ``idle_duration``, ``max_duration``): backend kinds among
  ``BACKEND_KINDS``, region names, a price above 0, durations
  (``Workflow.placement`` is what the server stores on each job).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from ._messages import describe
from ._units import parse_duration, parse_gpu, parse_size

BUILTIN_PROVIDERS = ("bash", "python", "docker")
# dstack 0.x's dev-environment providers: accepted in a file, refused when a
# run uses one (planning.NOT_BUILT_YET).
DEV_ENVIRONMENT_PROVIDERS = ("code", "lab", "notebook")
# checkpoint: synced by the runner on every backend and restored when a job
# resumes (docs/decisions/0030-checkpoint-versions.md). Every key has its
# behaviour now; the mechanism stays for the next new key.
NOT_SUPPORTED_YET: tuple[str, ...] = ()
# The backend kinds a workflow may name in ``backends:`` (docs/BACKENDS.md).
BACKEND_KINDS = ("aws", "local", "fake", "self-hosted")


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
    """``gpu: 2`` (a count), ``gpu: A100`` / ``gpu: A100:2`` (``NAME[:COUNT]``),
    and ``{name: A100:2}`` when the mapping gives no count of its own."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"count": value}
    if isinstance(value, str):
        name, count = parse_gpu(value)
        return {"name": name, "count": count}
    if isinstance(value, dict) and isinstance(value.get("name"), str) and ":" in value["name"]:
        if "count" in value:
            raise PydanticCustomError(
                "gpu", "write the count once: name '{name}' has one and so does count", {"name": value["name"]}
            )
        name, count = parse_gpu(value["name"])
        return {**value, "name": name, "count": count}
    return value


def _env_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise PydanticCustomError(
        "env_value", "an env value must be a string, number or boolean, got {got}", {"got": describe(value)}
    )


# A null in the mapping form (``KEY:`` with nothing) stays an error; only the
# list form's bare KEY means "from the submitting shell".
_NULL_VALUE = object()


def _env_shorthand(value: object) -> object:
    """dstack 0.x's list form: ``KEY=VALUE`` items, and bare ``KEY`` (None
    here: the value is the submitting shell's, ``planning`` fills it in)."""
    if isinstance(value, dict):
        return {k: _NULL_VALUE if v is None else v for k, v in value.items()}
    if not isinstance(value, list):
        return value
    out: dict[str, object] = {}
    for item in value:
        if not isinstance(item, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(=.*)?", item, re.DOTALL):
            raise PydanticCustomError(
                "env_item", "an env list item is KEY=VALUE or a bare KEY, got {got}", {"got": describe(item)}
            )
        key, sep, text = item.partition("=")
        if key in out:
            raise PydanticCustomError("env_item", "'{key}' is in the env list twice", {"key": key})
        out[key] = text if sep else None
    return out


def _env_value_or_inherited(value: object) -> str | None:
    if value is None:
        return None
    return _env_value(None if value is _NULL_VALUE else value)


def _dep_shorthand(value: object) -> object:
    """``":name"`` is ``{tag: name}`` (dstack 0.x)."""
    if isinstance(value, str):
        if value.startswith(":") and len(value) > 1:
            return {"tag": value[1:]}
        raise PydanticCustomError(
            "dep",
            "a dependency is ':tag-name' or a mapping {workflow|tag|run: name}, got '{value}'",
            {"value": value},
        )
    return value


def _path_shorthand(value: object) -> object:
    return {"path": value} if isinstance(value, str) else value


def _relative_path(value: str) -> str:
    path = PurePosixPath(value)
    if not value.strip() or path.is_absolute() or ".." in path.parts:
        raise PydanticCustomError(
            "rel_path", "expected a path inside the repository such as ./checkpoint, got '{value}'", {"value": value}
        )
    return value


def _artifact_path(value: str) -> str:
    """A path inside the repository, or an absolute path of the machine (a
    conda env folder, dstack 0.x): uploaded from there and restored at that
    same path for the jobs that depend on it (cloud and self-hosted machines)."""
    path = PurePosixPath(value)
    if path.is_absolute() and value.strip() != "/" and ".." not in path.parts:
        return value
    return _relative_path(value)


def _secret_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise PydanticCustomError(
            "secret_name",
            "a secret name is an environment variable name (letters, digits and _), got '{value}'",
            {"value": value},
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


def _backend_kind(value: str) -> str:
    if value not in BACKEND_KINDS:
        close = difflib.get_close_matches(value, BACKEND_KINDS, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise PydanticCustomError(
            "backend_kind",
            "unknown backend '{value}'; {hint}known backends: {known}",
            {"value": value, "hint": hint, "known": ", ".join(BACKEND_KINDS)},
        )
    return value


def _region(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", value):
        raise PydanticCustomError("region", "expected a region name such as us-east-1, got '{value}'", {"value": value})
    return value


def _ports_shorthand(value: object) -> object:
    """``ports: 2`` (dstack 0.x) asks for that many free ports: kept as a count."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= 100:
            raise PydanticCustomError(
                "port_count", "a count of free ports is from 1 to 100, got {value}", {"value": value}
            )
        return {"count": value}
    if isinstance(value, list):
        return {"numbers": value}
    raise PydanticCustomError(
        "ports", "expected a list of port numbers or a count of free ports, got {got}", {"got": describe(value)}
    )


def _not_empty(value: list[str]) -> list[str]:
    if not value:
        raise PydanticCustomError("empty_list", "an empty list allows nothing: name at least one, or leave the key out")
    return list(dict.fromkeys(value))


def _price(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError(
            "price", "expected a price in USD per hour such as 1.5, got {got}", {"got": describe(value)}
        )
    return value


def _positive_duration(value: int | str) -> int | str:
    if value == 0:
        raise PydanticCustomError("duration", "a duration of 0 means no time at all: write e.g. 30m, or off")
    return value


_Str = Annotated[str, Field(strict=True)]
_Count = Annotated[int, Field(strict=True, ge=1)]
_Size = Annotated[int, BeforeValidator(parse_size)]
_Duration = Annotated[int | str, BeforeValidator(parse_duration)]
_RelPath = Annotated[_Str, AfterValidator(_relative_path)]
_Positive = Annotated[int | str, BeforeValidator(parse_duration), AfterValidator(_positive_duration)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    # dstack 0.x: interruptible is spot_policy spot (false: on-demand); local
    # is backends [local, self-hosted] (false: no constraint).
    interruptible: StrictBool | None = None
    local: StrictBool | None = None


class ArtifactSpec(_Model):
    """An ``artifacts`` item: ``./model`` or ``{path: ./model, mount: true}``."""

    path: Annotated[_Str, AfterValidator(_artifact_path)]
    mount: StrictBool = False


class CacheSpec(_Model):
    """A ``cache`` item: ``~/.cache/pip`` or ``{path: ./models}``."""

    path: Annotated[_Str, Field(min_length=1)]


class Ports(_Model):
    """``ports``: a list of port numbers, or (dstack 0.x) a count of free ports."""

    numbers: list[Annotated[int, BeforeValidator(_port)]] = Field(default_factory=list)
    count: int = 0


class Dep(_Model):
    """``workflow``: a workflow of the run's files, or (dstack 0.x, not built
    yet) ``owner/repo/name`` of another repository."""

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
        # "off": no time limit, stored as 0.
        duration = 0 if self.duration == "off" else self.duration
        values = {"on_events": self.on_events, "limit": self.limit, "duration": duration}
        return {k: v for k, v in values.items() if v is not None}


def _not_built(what: str) -> Any:
    def refuse(value: object) -> object:
        if value is not None:
            raise PydanticCustomError("not_built", what)
        return value

    return BeforeValidator(refuse)


class EnvironmentSpec(_Model):
    """``environment:`` (docs/ENVIRONMENTS.md): a Python environment the
    runner builds once per key and reuses."""

    python: Annotated[_Str | None, BeforeValidator(_python_version), AfterValidator(_python_version_text)] = None
    requirements: _RelPath | None = None
    pip: list[_Str] = Field(default_factory=list)
    setup: list[_Str] = Field(default_factory=list)
    conda: Annotated[object, _not_built("conda environments are not built yet; use requirements or pip")] = None
    apt: Annotated[
        object, _not_built("apt packages are not installed by environments yet; install them in the commands")
    ] = None
    image: Annotated[
        object, _not_built("an image is not built from an environment yet; use provider: docker with image")
    ] = None

    def runner_spec(self, *, python: str | None = None, requirements: str | None = None) -> dict[str, object]:
        """What the runner gets (``AssignJob.environment``); empty parts left out."""
        values = {
            "python": self.python or python,
            "requirements": self.requirements or requirements,
            "pip": list(self.pip),
            "setup": list(self.setup),
        }
        return {k: v for k, v in values.items() if v}


class Workflow(_Model):
    name: Annotated[_Str, AfterValidator(_name)]
    provider: _Str
    commands: list[_Str] | None = None
    script: _Str | None = None
    requirements: _Str | None = None
    python: Annotated[_Str | None, BeforeValidator(_python_version), AfterValidator(_python_version_text)] = None
    image: _Str | None = None
    setup: list[_Str] | None = None
    environment: EnvironmentSpec | None = None
    help: _Str | None = None
    # None: a bare KEY of the list form, whose value the submitting shell gives.
    env: Annotated[
        dict[str, Annotated[str | None, BeforeValidator(_env_value_or_inherited)]], BeforeValidator(_env_shorthand)
    ] = Field(default_factory=dict)
    # The workspace secrets its jobs get, each as the variable of its name;
    # ``${{ secrets.NAME }}`` in commands and env names one too (``planning``).
    secrets: list[Annotated[_Str, AfterValidator(_secret_name)]] = Field(default_factory=list)
    ports: Annotated[Ports, BeforeValidator(_ports_shorthand)] = Field(default_factory=Ports)
    artifacts: list[Annotated[ArtifactSpec, BeforeValidator(_path_shorthand)]] = Field(default_factory=list)
    cache: list[Annotated[CacheSpec, BeforeValidator(_path_shorthand)]] = Field(default_factory=list)
    deps: list[Annotated[Dep, BeforeValidator(_dep_shorthand)]] = Field(default_factory=list)
    ssh: StrictBool = False
    checkpoint: _RelPath | None = None
    resources: Resources = Field(default_factory=Resources)
    backends: Annotated[list[Annotated[_Str, AfterValidator(_backend_kind)]], AfterValidator(_not_empty)] | None = None
    regions: Annotated[list[Annotated[_Str, AfterValidator(_region)]], AfterValidator(_not_empty)] | None = None
    spot_policy: Literal["spot", "on-demand", "auto"] | None = None
    max_price: Annotated[float, BeforeValidator(_price), Field(gt=0)] | None = None
    max_wait: _Positive | None = None
    idle_duration: _Duration | None = None
    max_duration: _Positive | None = None
    retry: Annotated[Retry | None, BeforeValidator(_retry_shorthand)] = None
    # A self-hosted or cloud runner that has lost the server for longer than
    # the unreachable grace stops the job ("stop"), so the server's retry
    # elsewhere is its only copy; "keep-running" lets it run on (docs/WORKFLOWS.md).
    on_server_lost: Literal["stop", "keep-running"] = "stop"

    def placement(self) -> dict[str, object]:
        """Where and how long its jobs may run, as the server stores it on
        each job (keys left out: the defaults; a duration ``off`` is the
        string "off"). docs/RUNS.md, "Placement"."""
        values = {
            "backends": self.backends or (["local", "self-hosted"] if self.resources.local else None),
            "regions": self.regions,
            "spot_policy": self.spot_policy or _interruptible_policy(self.resources.interruptible),
            "max_price": self.max_price,
            "max_wait": self.max_wait,
            "idle_duration": self.idle_duration,
            "max_duration": self.max_duration,
        }
        return {k: v for k, v in values.items() if v is not None}

    @property
    def artifact_paths(self) -> list[str]:
        """The paths uploaded when a job succeeds (the mounted ones too: they
        are also uploaded while it runs)."""
        return [a.path for a in self.artifacts]

    @property
    def inherited_env(self) -> list[str]:
        """The bare ``KEY`` items of a list ``env``: values the submitting shell gives."""
        return [k for k, v in self.env.items() if v is None]


def _interruptible_policy(interruptible: bool | None) -> str | None:
    return None if interruptible is None else ("spot" if interruptible else "on-demand")


# The keys only some providers read; a plugin declares the ones it reads
# (``Provider.workflow_keys``), the rest are refused in its workflows.
PROVIDER_KEYS: dict[str, frozenset[str]] = {
    "bash": frozenset({"commands", "python", "environment"}),
    "python": frozenset({"script", "requirements", "python", "environment"}),
    "docker": frozenset({"image", "commands"}),
    **{name: frozenset({"setup", "python"}) for name in DEV_ENVIRONMENT_PROVIDERS},
}
PROVIDER_SPECIFIC_KEYS = frozenset().union(*PROVIDER_KEYS.values())


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

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
- an artifact's ``to:`` is an ``s3://bucket/prefix/`` its files are copied
  to once uploaded; its prefix may hold ``${{ run.name }}``, ``${{ job.name }}``
  and ``${{ workflow.name }}`` (``export_destination`` fills them in);
- placement (``backends``, ``regions``, ``spot_policy``, ``max_price``,
  ``max_wait``, ``idle_duration``, ``max_duration``): backend kinds among
  ``BACKEND_KINDS``, region names, a price above 0, durations
  (``Workflow.placement`` is what the server stores on each job);
- ``max_cost``: USD above 0, whole cents (the run's cap, docs/COST.md);
- ``metrics``: training metrics read off the log lines (``MetricsSpec``):
  a regex that compiles and has a group, a name of its own (not a system
  metric's), each name once;
- guards: ``utilization_policy`` and ``stall`` (``UtilizationPolicy``,
  ``StallPolicy``), or ``off`` to turn the workspace's default off;
- ``inputs``: ``s3://bucket/key`` or ``https://…`` (``InputSpec``), each
  placed at a path inside the working directory; a ``sha256`` pin only on
  an ``https://`` file; ``mode: lazy`` is refused (not built).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ._messages import describe
from ._units import parse_duration, parse_gpu, parse_size

BUILTIN_PROVIDERS = ("bash", "python", "docker")
# dstack 0.x's dev-environment providers: JupyterLab, Jupyter Notebook, and a
# machine that stays up for VS Code over SSH (providers.DevEnvironmentProvider).
DEV_ENVIRONMENT_PROVIDERS = ("code", "lab", "notebook")
# checkpoint: synced by the runner on every backend and restored when a job
# resumes (docs/decisions/0030-checkpoint-versions.md). Every key has its
# behaviour now; the mechanism stays for the next new key.
NOT_SUPPORTED_YET: tuple[str, ...] = ()
# The backend kinds a workflow may name in ``backends:`` (docs/BACKENDS.md).
BACKEND_KINDS = ("aws", "kubernetes", "local", "fake", "self-hosted")
# The runner's protocol (trainyard_runner.protocol), which this package may not
# import: a training metric's name, the system metrics' names it may not take,
# and the bounds of ``AssignJob.metrics`` (tests/spec/test_metrics_keys.py
# checks they are equal).
METRIC_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$"
SYSTEM_METRIC_PATTERN = r"^(cpu|memory|disk_used|disk_total|net_rx|net_tx|gpu[0-9]+\.[a-z_]+)$"
MAX_METRIC_PATTERNS = 32
MAX_METRIC_REGEX_CHARS = 500
# ``metrics.interval``: how often the runner samples the job (AssignJob.metrics_interval).
METRICS_INTERVAL_SECONDS = (1, 3600)
# ``metrics.per_minute``: training values a job may report a minute (AssignJob.metrics_per_minute).
METRICS_PER_MINUTE_MAX = 100_000
# ``inputs:`` items a workflow may have (each is listed when its run is submitted).
MAX_INPUTS = 32
_S3_URI = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?")
_HTTPS_URI = re.compile(r"https://[^/\s?#]+/\S*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# An artifact's ``to:``: the variables its prefix may hold, and its length once filled in.
EXPORT_VARIABLES = ("run.name", "job.name", "workflow.name")
EXPORT_MAX_CHARS = 1024
_EXPRESSION_IN_TO = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


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


def _export_to(value: str) -> str:
    """``s3://bucket/prefix/``: a literal bucket, a prefix whose only
    expressions are ``EXPORT_VARIABLES`` (docs: outputs to a named place)."""
    bucket, _, prefix = value.removeprefix("s3://").partition("/")
    if not value.startswith("s3://"):
        raise PydanticCustomError(
            "export_to", "an artifact is copied to an S3 prefix: write to: s3://bucket/prefix/, got '{value}'",
            {"value": value},
        )  # fmt: skip
    if not _BUCKET.fullmatch(bucket):
        raise PydanticCustomError(
            "export_to",
            "'{bucket}' is not an S3 bucket name (3-63 lowercase letters, digits, '.' and '-'; no variables)",
            {"bucket": bucket},
        )
    for expression in _EXPRESSION_IN_TO.findall(prefix):
        if expression not in EXPORT_VARIABLES:
            known = ", ".join("${{ " + v + " }}" for v in EXPORT_VARIABLES)
            raise PydanticCustomError(
                "export_to", "unknown expression '{expression}' in to:; known: {known}",
                {"expression": "${{ " + expression + " }}", "known": known},
            )  # fmt: skip
    rest = _EXPRESSION_IN_TO.sub("x", prefix)
    if "${{" in rest or "}}" in rest:
        raise PydanticCustomError("export_to", "an unclosed '{open}' in to: '{value}'", {"open": "${{", "value": value})
    if ".." in rest.split("/") or len(value) > EXPORT_MAX_CHARS or not rest.isprintable():
        raise PydanticCustomError(
            "export_to",
            "to: must be a printable S3 prefix without '..' of at most {limit} characters",
            {"limit": EXPORT_MAX_CHARS},
        )
    return value


def export_destination(to: str, *, run_name: str, job_name: str, workflow_name: str) -> str:
    """``to`` with its variables filled in, as a prefix (ending with "/"):
    a file ``f`` of the artifact is copied to ``<prefix>f``."""
    values = {"run.name": run_name, "job.name": job_name, "workflow.name": workflow_name}
    filled = _EXPRESSION_IN_TO.sub(lambda m: values[m.group(1)], to)
    return filled if filled.endswith("/") else filled + "/"


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


# The largest amount of USD the server stores (backend.billing.models.MAX_AMOUNT).
MAX_USD = 10_000_000


def _usd(value: object) -> object:
    """``max_cost``: USD, a number above 0, whole cents, at most ``MAX_USD``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError(
            "usd", "expected an amount of USD such as 20 or 12.50, got {got}", {"got": describe(value)}
        )
    if not 0 < value <= MAX_USD:
        raise PydanticCustomError(
            "usd", "an amount of USD above 0 and at most {most}, got {value}", {"most": f"{MAX_USD:,}", "value": value}
        )
    if round(value, 2) != value:
        raise PydanticCustomError("usd", "whole cents at most (two decimals), got {value}", {"value": value})
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
    """An ``artifacts`` item: ``./model`` or ``{path: ./model, mount: true,
    to: s3://bucket/prefix/}`` (``to``: where its files are copied once uploaded)."""

    path: Annotated[_Str, AfterValidator(_artifact_path)]
    mount: StrictBool = False
    to: Annotated[_Str, AfterValidator(_export_to)] | None = None


def _input_shorthand(value: object) -> object:
    return {"uri": value} if isinstance(value, str) else value


def _input_uri(value: str) -> str:
    if _S3_URI.fullmatch(value):
        return value
    if _HTTPS_URI.fullmatch(value) and not value.endswith("/"):
        return value
    raise PydanticCustomError(
        "input_uri",
        "an input is s3://bucket/prefix/ (or one object's key) or an https:// file, got '{value}'",
        {"value": value},
    )


def _input_path(value: str) -> str:
    normal = value.strip()
    while normal.startswith("./"):
        normal = normal[2:]
    normal = normal.rstrip("/")
    path = PurePosixPath(normal)
    if not normal or normal == "." or path.is_absolute() or ".." in path.parts:
        raise PydanticCustomError(
            "input_path",
            "an input's path is a file or folder inside the working directory such as ./data/train, got '{value}'",
            {"value": value},
        )
    return str(path)


def _input_mode(value: str) -> str:
    if value == "lazy":
        raise PydanticCustomError(
            "input_mode",
            "mode: lazy is not built: inputs are downloaded in full before the commands start; "
            "remove mode (copy is the default)",
        )
    return value


class InputSpec(_Model):
    """An ``inputs`` item (docs/DATA.md): ``s3://bucket/prefix/`` or
    ``{uri, path, read_only, mode, sha256}``. ``path`` defaults to the
    URI's last component (``target``)."""

    uri: Annotated[_Str, AfterValidator(_input_uri)]
    path: Annotated[_Str, AfterValidator(_input_path)] | None = None
    read_only: StrictBool = True
    mode: Annotated[Literal["copy", "lazy"], AfterValidator(_input_mode)] = "copy"
    sha256: _Str | None = None

    @field_validator("sha256")
    @classmethod
    def _pin(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        if str(info.data.get("uri", "")).startswith("s3://"):
            raise PydanticCustomError(
                "input_pin",
                "sha256 pins an https:// file; an s3:// object is identified by its version or ETag "
                "(remove sha256 here)",
            )
        if not _SHA256.fullmatch(value.lower()):
            raise PydanticCustomError(
                "input_pin", "sha256 is the file's digest in 64 hex digits, got '{value}'", {"value": value}
            )
        return value.lower()

    @property
    def target(self) -> str:
        """Where it is placed, relative to the working directory."""
        if self.path:
            return self.path
        rest = self.uri.split("://", 1)[1].split("?", 1)[0].rstrip("/")
        return rest.rsplit("/", 1)[-1]

    def planned(self) -> dict[str, object]:
        """As a JobPlan carries it (``JobPlan.data``)."""
        return {"uri": self.uri, "path": self.target, "read_only": self.read_only, "sha256": self.sha256 or ""}


class CacheSpec(_Model):
    """A ``cache`` item: ``~/.cache/pip`` or ``{path: ./models}``."""

    path: Annotated[_Str, Field(min_length=1)]


def _volume_shorthand(value: object) -> object:
    """``NAME:/path`` is ``{name: NAME, path: /path}``."""
    if isinstance(value, str):
        name, sep, path = value.partition(":")
        if not sep or not name or not path:
            raise PydanticCustomError(
                "volume",
                "expected NAME:/path (e.g. imagenet-cache:/data) or {{name, path}}, got '{value}'",
                {"value": value},
            )
        return {"name": name, "path": path}
    return value


def _volume_name(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", value):
        raise PydanticCustomError(
            "volume_name",
            "a volume's name is 1 to 63 lowercase letters, digits and dashes (e.g. imagenet-cache), got '{value}'",
            {"value": value},
        )
    return value


def _volume_path(value: str) -> str:
    path = PurePosixPath(value)
    if not value.strip() or ".." in path.parts or str(path) in ("/", "."):
        raise PydanticCustomError(
            "volume_path",
            "expected where to mount the volume: an absolute path (/data) or one inside the working directory"
            " (./data), got '{value}'",
            {"value": value},
        )
    return value


def _unique_volumes(value: list[VolumeUse]) -> list[VolumeUse]:
    names = [v.name for v in value]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PydanticCustomError(
            "volume_twice", "volume '{name}' is named twice: a job mounts a volume once", {"name": twice[0]}
        )
    return value


class VolumeUse(_Model):
    """A ``volumes`` item: a volume of the workspace (``trainyard volume
    create``) mounted at ``path`` for the job; ``NAME:/path`` for short."""

    name: Annotated[_Str, AfterValidator(_volume_name)]
    path: Annotated[_Str, AfterValidator(_volume_path)]
    read_only: StrictBool = False


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


RetryEvent = Literal["interruption", "instance_lost", "error", "no_capacity", "low_gpu_utilization", "stalled"]


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


def _metric_name(value: str) -> str:
    if not re.fullmatch(METRIC_NAME_PATTERN, value):
        raise PydanticCustomError(
            "metric_name",
            "a metric name is letters, digits, '_', '.', '/' and '-', starting with a letter or '_' "
            "(at most 64 characters), got '{value}'",
            {"value": value},
        )
    if re.fullmatch(SYSTEM_METRIC_PATTERN, value):
        raise PydanticCustomError(
            "metric_name",
            "'{value}' is a system metric's name (cpu, memory, disk_used, disk_total, net_rx, net_tx, "
            "gpu<N>.<metric>): give the training metric another, e.g. train/{value}",
            {"value": value},
        )
    return value


def _metric_regex(value: str) -> str:
    """A Python ``re`` pattern with the value in a group: ``value`` or the
    first group (``step``, where it has one, is the step)."""
    try:
        compiled = re.compile(value)
    except re.error as e:
        at = f" at position {e.pos}" if e.pos is not None else ""
        raise PydanticCustomError(
            "metric_regex", "the regex does not compile: {error}{at}", {"error": e.msg, "at": at}
        ) from None
    if compiled.groups == 0:
        raise PydanticCustomError(
            "metric_regex",
            "the regex has no group for the value: put it in parentheses, e.g. 'loss ([0-9.eE+-]+)', "
            "or name it (?P<value>...)",
        )
    if "value" not in compiled.groupindex and compiled.groupindex.get("step") == 1 and compiled.groups == 1:
        raise PydanticCustomError(
            "metric_regex", "the regex's only group is 'step': add a group for the value, e.g. (?P<value>[0-9.]+)"
        )
    return value


class MetricPatternSpec(_Model):
    """A ``metrics`` item: the metric ``name`` and the ``regex`` searched in
    every log line of the job."""

    name: Annotated[_Str, AfterValidator(_metric_name)]
    regex: Annotated[_Str, Field(min_length=1, max_length=MAX_METRIC_REGEX_CHARS), AfterValidator(_metric_regex)]


def _metrics_shorthand(value: object) -> object:
    """``metrics: [{name, regex}]`` is ``metrics: {patterns: [...]}``."""
    return {"patterns": value} if isinstance(value, list) else value


def _metrics_interval(value: int | str) -> int | str:
    low, high = METRICS_INTERVAL_SECONDS
    if not isinstance(value, int) or not low <= value <= high:
        raise PydanticCustomError(
            "duration",
            "the sampling interval is from {low}s to {high}s, got {got}",
            {"low": low, "high": high, "got": describe(value)},
        )
    return value


class MetricsSpec(_Model):
    """``metrics:`` (docs/WORKFLOWS.md, "Metrics"): the log patterns, how
    often the runner samples the job (None: every 5 s) and how many training
    values a minute it keeps (None: 600)."""

    interval: Annotated[int | str, BeforeValidator(parse_duration), AfterValidator(_metrics_interval)] | None = None
    patterns: Annotated[list[MetricPatternSpec], Field(max_length=MAX_METRIC_PATTERNS)] = Field(default_factory=list)
    per_minute: Annotated[int, Field(strict=True, ge=1, le=METRICS_PER_MINUTE_MAX)] | None = None

    def duplicates(self) -> list[int]:
        """The indexes of the patterns whose name an earlier one has."""
        seen: set[str] = set()
        found = []
        for index, pattern in enumerate(self.patterns):
            if pattern.name in seen:
                found.append(index)
            seen.add(pattern.name)
        return found


def _guard_off(value: object) -> object:
    """``off`` (YAML reads it as false) turns the workspace's default off: the
    key is there with no policy (``Workflow.guards``)."""
    return None if value is False or (isinstance(value, str) and value.strip().lower() == "off") else value


def _not_off(value: int | str) -> int | str:
    if value == "off":
        raise PydanticCustomError(
            "duration",
            "write a duration such as 30m here (to turn the guard off, write off as its whole value, e.g. stall: off)",
        )
    return value


_GuardDuration = Annotated[
    int | str, BeforeValidator(parse_duration), AfterValidator(_positive_duration), AfterValidator(_not_off)
]


class UtilizationPolicy(_Model):
    """``utilization_policy:``: stop a job whose GPUs all stayed below
    ``min_gpu_utilization`` percent for the whole ``time_window`` (seconds)."""

    min_gpu_utilization: Annotated[int, Field(strict=True, ge=1, le=100)]
    time_window: _GuardDuration

    def stored(self) -> dict[str, object]:
        return {"min_gpu_utilization": self.min_gpu_utilization, "time_window": self.time_window}


class StallPolicy(_Model):
    """``stall:``: a job with no new log line and no new training value for
    ``timeout`` (seconds) is stopped (``stop``) or its attempt is ended and
    a new one resumes from its last checkpoint (``restart``)."""

    timeout: _GuardDuration
    action: Literal["stop", "restart"] = "stop"

    def stored(self) -> dict[str, object]:
        return {"timeout": self.timeout, "action": self.action}


class Workflow(_Model):
    name: Annotated[_Str, AfterValidator(_name)]
    provider: _Str
    commands: list[_Str] | None = None
    script: _Str | None = None
    requirements: _Str | None = None
    python: Annotated[_Str | None, BeforeValidator(_python_version), AfterValidator(_python_version_text)] = None
    image: _Str | None = None
    setup: list[_Str] | None = None
    # dstack 0.x's dev environments: the version of JupyterLab, Notebook or
    # VS Code (refused when a run uses it: planning.NOT_BUILT_YET).
    version: _Str | int | float | None = None
    # A dev environment with no session into it for this long is stopped
    # ("off": never; None: the workspace's default). docs/WORKFLOWS.md.
    inactivity_duration: _Positive | None = None
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
    # Data from outside Trainyard, listed at submission (docs/DATA.md).
    inputs: Annotated[list[Annotated[InputSpec, BeforeValidator(_input_shorthand)]], Field(max_length=MAX_INPUTS)] = (
        Field(default_factory=list)
    )
    # Persistent volumes of the workspace, mounted for every job of the workflow (docs/DATA.md, "Volumes").
    volumes: Annotated[
        list[Annotated[VolumeUse, BeforeValidator(_volume_shorthand)]],
        Field(max_length=8),
        AfterValidator(_unique_volumes),
    ] = Field(default_factory=list)
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
    # The most a run of this workflow may cost, USD (docs/COST.md, "Budgets
    # and quotas"); the run's own cap, stored on the run, not on its jobs.
    max_cost: Annotated[float, BeforeValidator(_usd)] | None = None
    retry: Annotated[Retry | None, BeforeValidator(_retry_shorthand)] = None
    # Training metrics from the log lines, the sampling interval, the cap.
    metrics: Annotated[MetricsSpec | None, BeforeValidator(_metrics_shorthand)] = None
    # Guards (docs/WORKFLOWS.md, "Guards"); "off": not even the workspace's default.
    utilization_policy: Annotated[UtilizationPolicy | None, BeforeValidator(_guard_off)] = None
    stall: Annotated[StallPolicy | None, BeforeValidator(_guard_off)] = None
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

    def guards(self) -> dict[str, object]:
        """The guards as the server stores them on each job (``"off"``: the
        workspace's default turned off; a key left out: the workspace's
        default applies). Durations in seconds."""
        out: dict[str, object] = {}
        for key, policy in (("utilization_policy", self.utilization_policy), ("stall", self.stall)):
            if policy is not None:
                out[key] = policy.stored()
            elif key in self.model_fields_set:  # written as off
                out[key] = "off"
        return out

    @property
    def artifact_paths(self) -> list[str]:
        """The paths uploaded when a job succeeds (the mounted ones too: they
        are also uploaded while it runs)."""
        return [a.path for a in self.artifacts]

    def input_clashes(self) -> list[tuple[int, str]]:
        """The inputs whose path an earlier input has, or lies inside or
        around an earlier input's path: (index, what is wrong)."""
        found: list[tuple[int, str]] = []
        for index, item in enumerate(self.inputs):
            mine = PurePosixPath(item.target)
            for first, earlier in enumerate(self.inputs[:index]):
                theirs = PurePosixPath(earlier.target)
                if mine == theirs:
                    found.append(
                        (index, f"path {item.target} is also input {first}'s: give each input a path of its own")
                    )
                    break
                if theirs in mine.parents or mine in theirs.parents:
                    found.append(
                        (
                            index,
                            f"path {item.target} and input {first}'s {earlier.target} overlap: "
                            "place inputs side by side, not one inside another",
                        )
                    )
                    break
        return found

    @property
    def exports(self) -> dict[str, str]:
        """{artifact path: ``to`` as written} for the artifacts copied to a named place."""
        return {a.path: a.to for a in self.artifacts if a.to}

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
    **{
        name: frozenset({"setup", "python", "environment", "requirements", "version", "inactivity_duration"})
        for name in DEV_ENVIRONMENT_PROVIDERS
    },
}
PROVIDER_SPECIFIC_KEYS = frozenset().union(*PROVIDER_KEYS.values())
# Keys a dstack 0.x provider read past without a word, found in real dstack
# repos: accepted with a warning and dropped, never refused (docs/WORKFLOWS.md,
# "Keys dstack 0.x ignored"). Each names what to write instead.
DSTACK_IGNORED_KEYS: dict[str, dict[str, str]] = {
    "bash": {
        "requirements": "to install them, write environment: {requirements: FILE} (or pip install -r FILE in commands)",
    },
    "docker": {
        "requirements": "install them in the image or in commands",
    },
}


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

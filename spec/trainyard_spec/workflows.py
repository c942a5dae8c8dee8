"""The workflows files: loading and validating them, with file/line/key
errors. ``schema`` has the keys, ``planning`` turns a workflow of the loaded
files into the jobs of a run. docs/WORKFLOWS.md is the user's reference.

Shared by the CLI (validates before anything is uploaded) and the server
(validates again on submit), so nothing here prints or touches a terminal.

The files are ``.trainyard/workflows.yaml``, ``.dstack/workflows.yaml`` and
the ``*.yaml`` of ``.trainyard/workflows/`` and ``.dstack/workflows/``
(``find_workflows_files``), read together (``load_workflows``)::

    workflows:
      - name: train
        provider: bash            # bash | python | docker
        commands: [python train.py]
        env: {STEPS: 20}
        artifacts: [./checkpoint]
        resources: {cpu: 4, memory: 16GB, gpu: {name: A100, count: 1}}

Beyond the schema of each workflow (``schema``), a file must have:

- a top-level mapping with a ``workflows`` list and nothing else (else the
  whole load fails);
- workflow names unique across the files;
- a known ``provider``; ``bash`` needs ``commands``, ``python`` needs
  ``script`` (and may have ``requirements``), ``docker`` needs ``image``;
- ``provider`` may also name a plugin (``trainyard.providers`` entry point,
  see ``providers``); its extra keys are validated by the plugin's
  ``options`` model, with the same file/line/key errors.

A workflow that breaks one of these rules is ``broken``: a run of it fails
with its errors, the other workflows stay usable (``load_workflows_file`` is
the strict form: any error fails the file).

A key that a dstack 0.x provider ignored (``schema.DSTACK_IGNORED_KEYS``, such
as ``requirements`` on ``bash``) is dropped and listed in ``ignored``, with
its file and line, for the CLI to show as a warning; the workflow loads.

Keys whose behaviour is not built yet (``schema.NOT_SUPPORTED_YET``,
``planning.NOT_BUILT_YET``) validate like the rest but are refused when a
run is planned (``planning.resolve_run_plan``), i.e. only when a run uses a
workflow that has them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from . import _yamltree
from ._messages import describe, key_path, message, unknown_key
from .providers import Provider, ProviderNotFound, get_provider
from .schema import (
    BUILTIN_PROVIDERS,
    DEV_ENVIRONMENT_PROVIDERS,
    DSTACK_IGNORED_KEYS,
    PROVIDER_KEYS,
    PROVIDER_SPECIFIC_KEYS,
    Workflow,
    WorkflowError,
    WorkflowFileError,
)

WORKFLOW_FILES = (".trainyard/workflows.yaml", ".dstack/workflows.yaml")
# dstack 0.x splits workflows over files: every *.yaml (or .yml) here is read too.
WORKFLOW_DIRS = (".trainyard/workflows", ".dstack/workflows")
# Workflows one file may hold: every one is validated on every plan and
# submission, by the CLI and again by the server (docs/WORKFLOWS.md, "Limits").
MAX_WORKFLOWS_PER_FILE = 1000
_PROVIDER_REQUIRED = {
    "bash": ("commands", "a list of shell commands"),
    "python": ("script", "the Python file to run"),
    "docker": ("image", "the container image"),
}
_BUILT_IN = (*BUILTIN_PROVIDERS, *DEV_ENVIRONMENT_PROVIDERS)
_VERSION_TEXT = re.compile(r"\d+(\.\d+)*")
_M = TypeVar("_M", bound=BaseModel)


@dataclass(frozen=True)
class Source:
    """One workflows file as read: its path in the repo and its text."""

    path: str
    text: str


@dataclass(frozen=True)
class _Where:
    path: str
    tree: _yamltree.Tree
    index: int


# ---------------------------------------------------------------- the file


class WorkflowsFile:
    """The validated workflows of one or more files, in the files' order.

    ``workflows``: the valid ones. ``broken``: a workflow name (or
    ``FILE workflows[i]`` for one without a usable name) to its errors: it
    cannot be run, the others can (``warnings`` lists those errors).
    ``ignored``: the keys of loaded workflows that were dropped as dstack
    0.x dropped them, each placed at its line.
    """

    def __init__(
        self,
        *,
        path: str,
        workflows: dict[str, Workflow],
        tree: _yamltree.Tree | None = None,
        options: dict[str, BaseModel] | None = None,
        where: dict[str, _Where] | None = None,
        broken: dict[str, list[WorkflowError]] | None = None,
        paths: list[str] | None = None,
        ignored: list[WorkflowError] | None = None,
    ) -> None:
        self.path = path
        self.paths = paths or [path]
        self.workflows = workflows
        self.broken = broken or {}
        self.ignored = ignored or []
        self._where = where or {
            name: _Where(path, tree or _yamltree.Tree(data=None), i) for i, name in enumerate(workflows)
        }
        self._options = options or {}

    @property
    def warnings(self) -> list[WorkflowError]:
        """The errors of the workflows that cannot be run."""
        return [e for errors in self.broken.values() for e in errors]

    def options_of(self, name: str) -> BaseModel | None:
        """The validated plugin options of workflow ``name`` (None for built-in providers)."""
        return self._options.get(name)

    def file_of(self, name: str) -> str:
        """The path of the file that defines workflow ``name``."""
        return self._where[name].path

    def line_of(self, name: str) -> int | None:
        where = self._where[name]
        return where.tree.line_of(("workflows", where.index, "name"))

    def get(self, name: str) -> Workflow:
        """The workflow called ``name``; WorkflowFileError with its own errors
        if it is broken, or listing the names if there is none."""
        if name in self.workflows:
            return self.workflows[name]
        if name in self.broken:
            raise WorkflowFileError(self.broken[name])
        close = difflib.get_close_matches(name, list(self.workflows), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        has = "the file has" if len(self.paths) == 1 else "the files have"
        message = f"no workflow named '{name}'; {hint}{has}: {', '.join(self.workflows) or 'none'}"
        # The one asked for may be a broken one whose name could not be read.
        raise WorkflowFileError([*self.warnings, WorkflowError(self.path, None, "workflows", message)])

    def error(self, workflow: Workflow, key: str | tuple[str | int, ...], message: str) -> WorkflowError:
        """An error about ``key`` of ``workflow`` (a key, or a path such as
        ``("deps", 0, "workflow")``), placed at that key's line in its file."""
        loc = (key,) if isinstance(key, str) else key
        where = self._where.get(workflow.name)
        if where is None or self.workflows.get(workflow.name) is not workflow:
            return WorkflowError(self.path, None, key_path(loc, None, prefix=workflow.name), message)
        path = ("workflows", where.index, *loc)
        return WorkflowError(where.path, where.tree.line_of(path), key_path(path, where.tree.data), message)

    def env_key(self, workflow: Workflow, name: str) -> tuple[str | int, ...]:
        """Where ``env`` names ``name``: ``("env", i)`` in the list form, ``("env", name)`` otherwise."""
        where = self._where.get(workflow.name)
        data = where.tree.data["workflows"][where.index] if where else None
        items = data.get("env") if isinstance(data, dict) else None
        if isinstance(items, list):
            for i, item in enumerate(items):
                if isinstance(item, str) and item.partition("=")[0] == name:
                    return ("env", i)
        return ("env", name)


def find_workflows_file(root: Path) -> Path:
    """The first of WORKFLOW_FILES that exists under ``root``."""
    for name in WORKFLOW_FILES:
        if (root / name).is_file():
            return root / name
    raise WorkflowFileError([_none_found(root)])


def find_workflows_files(root: Path) -> list[Path]:
    """Every workflows file under ``root``, sorted by path: WORKFLOW_FILES
    and the ``*.yaml``/``*.yml`` files of WORKFLOW_DIRS."""
    found = [root / name for name in WORKFLOW_FILES if (root / name).is_file()]
    for folder in WORKFLOW_DIRS:
        if (root / folder).is_dir():
            found += [p for p in (root / folder).iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()]
    if not found:
        raise WorkflowFileError([_none_found(root)])
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def load_workflows_file(text: str, *, path: str) -> WorkflowsFile:
    """Parse and validate a whole file strictly: WorkflowFileError lists
    every problem, of every workflow (``load_workflows`` is lenient)."""
    file = load_workflows([Source(path, text)])
    if file.broken:
        raise WorkflowFileError(_sorted(file.warnings, [path]))
    return file


def load_workflows(sources: Sequence[Source]) -> WorkflowsFile:
    """Parse and validate the workflows of ``sources`` together.

    1. per file: YAML syntax (a syntax error stops here, with the line of
       the mark) and the top level: a mapping with a ``workflows`` list and
       nothing else; any of these fails the whole load (WorkflowFileError);
    2. each workflow against the pydantic schema, errors mapped to lines;
    3. per valid workflow: a name unique across the files, a known provider,
       the provider's keys, no contradicting keys.

    A workflow with errors in 2 or 3 is ``broken``: the rest stay usable.
    """
    failed: list[WorkflowError] = []
    loaded: list[tuple[Source, _yamltree.Tree, list[Any]]] = []
    for source in sources:
        tree, items, errors = _parse(source)
        failed += errors
        loaded.append((source, tree, items))
    if failed:
        raise WorkflowFileError(_sorted(failed, [s.path for s in sources]))
    state = _Loaded()
    for source, tree, items in loaded:
        for index, item in enumerate(items):
            _load_one(state, item, _Where(source.path, tree, index))
    return WorkflowsFile(
        path=sources[0].path if sources else "",
        paths=[s.path for s in sources],
        workflows=state.workflows,
        options=state.options,
        where=state.where,
        broken=state.broken,
        ignored=state.ignored,
    )


@dataclass
class _Loaded:
    workflows: dict[str, Workflow] = field(default_factory=dict)
    options: dict[str, BaseModel] = field(default_factory=dict)
    where: dict[str, _Where] = field(default_factory=dict)
    broken: dict[str, list[WorkflowError]] = field(default_factory=dict)
    seen: dict[str, _Where] = field(default_factory=dict)
    ignored: list[WorkflowError] = field(default_factory=list)


def _parse(source: Source) -> tuple[_yamltree.Tree, list[Any], list[WorkflowError]]:
    """The tree, the workflow items and the errors that fail the file."""
    path = source.path
    try:
        tree = _yamltree.parse_checked(source.text)
    except yaml.MarkedYAMLError as e:
        return _yamltree.Tree(data=None), [], [_yaml_error(e, path)]
    errors = [
        WorkflowError(path, e.line, key_path(e.path, tree.data) or "(top level)", e.message)
        for e in tree.errors
        if _workflow_index(e.path) is None
    ]
    items = _top_level(tree, path, errors)
    return tree, items, errors


def _load_one(state: _Loaded, item: Any, where: _Where) -> None:
    errors = [
        WorkflowError(where.path, e.line, key_path(e.path, where.tree.data), e.message)
        for e in where.tree.errors
        if _workflow_index(e.path) == where.index
    ]
    ignored: list[WorkflowError] = []
    item = _without_ignored_keys(item, where, ignored)
    workflow, options = _validate_workflow(item, where.index, where.tree, where.path, errors)
    label = _label(item, where)
    if workflow is not None:
        _check_workflow(workflow, where, errors)
    if label in state.seen:  # a broken one too: neither of the two can be meant
        errors.append(_duplicate(label, state.seen[label], where))
    state.seen.setdefault(label, where)
    if errors:
        state.broken.setdefault(label, []).extend(errors)
        state.workflows.pop(label, None)
        return
    assert workflow is not None
    state.workflows[label], state.where[label] = workflow, where
    state.ignored += ignored
    if options is not None:
        state.options[label] = options


def _without_ignored_keys(item: Any, where: _Where, ignored: list[WorkflowError]) -> Any:
    """``item`` without the keys its provider ignored in dstack 0.x, each one
    added to ``ignored`` at its line."""
    provider = item.get("provider") if isinstance(item, dict) else None
    dropped = DSTACK_IGNORED_KEYS.get(provider, {}) if isinstance(provider, str) else {}
    present = [key for key in item if key in dropped] if dropped else []
    for key in present:
        loc = ("workflows", where.index, key)
        message = f"ignored: the {provider} provider does not use '{key}' (dstack 0.x ignored it too); {dropped[key]}"
        ignored.append(WorkflowError(where.path, where.tree.line_of(loc), key_path(loc, where.tree.data), message))
    return {k: v for k, v in item.items() if k not in present} if present else item


def _label(item: Any, where: _Where) -> str:
    name = item.get("name") if isinstance(item, dict) else None
    return name if isinstance(name, str) and name else f"{where.path} workflows[{where.index}]"


def _duplicate(name: str, first: _Where, second: _Where) -> WorkflowError:
    line = first.tree.line_of(("workflows", first.index, "name"))
    at = f"line {line}" if first.path == second.path else f"{first.path}:{line}"
    loc = ("workflows", second.index, "name")
    return WorkflowError(
        second.path,
        second.tree.line_of(loc),
        key_path(loc, second.tree.data),
        f"duplicate workflow name '{name}' (first at {at})",
    )


def _workflow_index(path: tuple[str | int, ...]) -> int | None:
    return path[1] if len(path) > 1 and path[0] == "workflows" and isinstance(path[1], int) else None


def _sorted(errors: list[WorkflowError], paths: list[str]) -> list[WorkflowError]:
    order = {p: i for i, p in enumerate(paths)}
    return sorted(errors, key=lambda e: (order.get(e.file, len(order)), e.line or 0))


def _none_found(root: Path) -> WorkflowError:
    message = (
        f"no workflows file: `trainyard init` writes a starter, or create {WORKFLOW_FILES[0]} "
        f"(or {WORKFLOW_FILES[1]}) with a 'workflows:' list"
    )
    return WorkflowError(str(root), None, "workflows", message)


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
    if isinstance(items, list) and len(items) > MAX_WORKFLOWS_PER_FILE:
        errors.append(
            WorkflowError(
                path,
                tree.lines[("workflows",)],
                "workflows",
                f"{len(items)} workflows in one file: at most {MAX_WORKFLOWS_PER_FILE}; split them into several "
                "files of .trainyard/workflows/",
            )
        )
        return []
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
    raw_python = tree.raw.get((*base, "python"))
    if raw_python is not None and _VERSION_TEXT.fullmatch(raw_python):
        item = {**item, "python": raw_python}  # python: 3.10 is "3.10" as written, not the number 3.1
    provider = item.get("provider")
    if not isinstance(provider, str) or provider in _BUILT_IN:
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
            loc = (*base, *_as_written(err["loc"], item))
            beside = None if model is Workflow else list(Workflow.model_fields)
            errors.append(
                WorkflowError(path, tree.line_of(loc), key_path(loc, tree.data), message(err, model, beside=beside))
            )
        return None


def _as_written(loc: tuple[str | int, ...], item: Any) -> tuple[str | int, ...]:
    """``loc`` without the parts a shorthand has and the file has not:
    ``artifacts[0].path`` of ``- ./model`` is ``artifacts[0]``,
    ``ports.numbers[1]`` of ``ports: [80, 0]`` is ``ports[1]``."""
    out: list[str | int] = []
    node = item
    for part in loc:
        if isinstance(node, list) and isinstance(part, str):
            continue
        if isinstance(node, str):
            break
        out.append(part)
        if isinstance(node, dict):
            node = node.get(part) if isinstance(part, str) else None
        elif isinstance(node, list):
            node = node[part] if isinstance(part, int) and part < len(node) else None
    return tuple(out)


def _plugin(name: str) -> Provider | None:
    try:
        return get_provider(name)
    except ProviderNotFound:
        return None


def _check_workflow(wf: Workflow, where: _Where, errors: list[WorkflowError]) -> None:
    def add(key: str | tuple[str | int, ...], message: str) -> None:
        loc: tuple[str | int, ...] = ("workflows", where.index, *((key,) if isinstance(key, str) else key))
        errors.append(WorkflowError(where.path, where.tree.line_of(loc), key_path(loc, where.tree.data), message))

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
    for keys, problem in _contradictions(wf):
        add(keys, problem)
    for index, problem in wf.input_clashes():
        written = (
            where.tree.data["workflows"][where.index]["inputs"][index] if isinstance(where.tree.data, dict) else None
        )
        add(
            ("inputs", index, "path") if isinstance(written, dict) and "path" in written else ("inputs", index), problem
        )
    if wf.metrics is not None:
        for index in wf.metrics.duplicates():
            name = wf.metrics.patterns[index].name
            first = next(i for i, p in enumerate(wf.metrics.patterns) if p.name == name)
            add(
                (*_metrics_loc(where), index, "name"),
                f"metric '{name}' is declared twice (first as item {first}): give each pattern a name of its own",
            )


def _input_path_loc(where: _Where, index: int) -> tuple[str | int, ...]:
    """Where an input's path is written: its ``path`` key, else the item (the shorthand)."""
    item = where.tree.data["workflows"][where.index] if isinstance(where.tree.data, dict) else None
    written = item.get("inputs") if isinstance(item, dict) else None
    entry = written[index] if isinstance(written, list) and index < len(written) else None
    return ("inputs", index, "path") if isinstance(entry, dict) and "path" in entry else ("inputs", index)


def _metrics_loc(where: _Where) -> tuple[str, ...]:
    """Where the patterns are: ``metrics`` itself (the list form) or ``metrics.patterns``."""
    item = where.tree.data["workflows"][where.index] if isinstance(where.tree.data, dict) else None
    written = item.get("metrics") if isinstance(item, dict) else None
    return ("metrics",) if isinstance(written, list) else ("metrics", "patterns")


def _contradictions(wf: Workflow) -> list[tuple[tuple[str, ...], str]]:
    """dstack 0.x's resources keys against the placement keys they mean."""
    found: list[tuple[tuple[str, ...], str]] = []
    interruptible, policy = wf.resources.interruptible, wf.spot_policy
    if interruptible is not None and policy is not None and policy != ("spot" if interruptible else "on-demand"):
        means = "spot" if interruptible else "on-demand"
        found.append(
            (
                ("resources", "interruptible"),
                f"interruptible: {str(interruptible).lower()} means spot_policy: {means}, "
                f"but spot_policy is {policy}; keep one of them",
            )
        )
    others = [b for b in wf.backends or [] if b not in ("local", "self-hosted")]
    if wf.resources.local and others:
        found.append(
            (
                ("resources", "local"),
                f"local: true means backends: [local, self-hosted], but backends names {', '.join(others)}; "
                "keep one of them",
            )
        )
    return found


def _not_for(key: str, provider: str) -> str:
    users = [p for p, keys in PROVIDER_KEYS.items() if key in keys]
    if provider in _BUILT_IN:
        names = ", ".join(users[:-1]) + f" and {users[-1]} providers" if len(users) > 2 else " and ".join(users)
        return f"'{key}' is for the {names}{'' if len(users) > 2 else ' provider'}, not {provider}"
    return f"'{key}' is not used by the {provider} provider"

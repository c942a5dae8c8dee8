"""The workflow file: loading and validating a whole file, with file/line/key
errors. ``schema`` has the keys, ``planning`` turns a workflow of a loaded
file into the jobs of a run.

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

Beyond the schema of each workflow (``schema``), a file must have:

- a top-level mapping with a ``workflows`` list and nothing else;
- unique workflow names;
- a known ``provider``; ``bash`` needs ``commands``, ``python`` needs
  ``script`` (and may have ``requirements``), ``docker`` needs ``image``;
- ``provider`` may also name a plugin (``trainyard.providers`` entry point,
  see ``providers``); its extra keys are validated by the plugin's
  ``options`` model, with the same file/line/key errors.

Keys whose behaviour is not built yet (``schema.NOT_SUPPORTED_YET``) validate
like the rest but are refused when a run is planned
(``planning.resolve_run_plan``), i.e. only when a run uses a workflow that
has them.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from . import _yamltree
from ._messages import describe, key_path, message, unknown_key
from .providers import Provider, ProviderNotFound, get_provider
from .schema import BUILTIN_PROVIDERS, PROVIDER_KEYS, PROVIDER_SPECIFIC_KEYS, Workflow, WorkflowError, WorkflowFileError

WORKFLOW_FILES = (".trainyard/workflows.yaml", ".dstack/workflows.yaml")
_PROVIDER_REQUIRED = {
    "bash": ("commands", "a list of shell commands"),
    "python": ("script", "the Python file to run"),
    "docker": ("image", "the container image"),
}
_M = TypeVar("_M", bound=BaseModel)


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
    try:
        return get_provider(name)
    except ProviderNotFound:
        return None


def _check_workflow(
    wf: Workflow, index: int, tree: _yamltree.Tree, path: str, seen: dict[str, Workflow], errors: list[WorkflowError]
) -> None:
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

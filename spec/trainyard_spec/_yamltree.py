"""YAML to plain Python data, keeping the line of every key and list item.

PyYAML's ``yaml.compose`` (SafeLoader) gives a node tree with marks; this
module walks it once and returns the data plus a map from a key path
(``("workflows", 2, "resources", "memory")``) to its 1-based line, so a
validation error found later can point at the line the user wrote.

Differences from ``yaml.safe_load``, on purpose:
- mapping keys are the key's text as written (``on:`` stays ``"on"``, not
  ``True``), and a duplicated key is an error instead of last-one-wins;
- timestamps and other exotic tags stay strings;
- the raw text of every plain scalar is kept (``Raw.text``) so env values can
  be passed on as written (``VERSION: 1.10`` is ``"1.10"``, not ``1.1``);
- a node budget and a depth limit stop alias bombs and recursive aliases
  (the server parses untrusted files with this).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

Path = tuple[str | int, ...]

MAX_NODES = 200_000
MAX_DEPTH = 64

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"


@dataclass(frozen=True)
class TreeError:
    line: int | None
    path: Path
    message: str


@dataclass
class Tree:
    """The parsed document: ``data``, ``lines[path]`` and ``raw[path]``
    (the source text of each plain non-string scalar)."""

    data: Any
    lines: dict[Path, int] = field(default_factory=dict)
    raw: dict[Path, str] = field(default_factory=dict)
    errors: list[TreeError] = field(default_factory=list)

    def line_of(self, path: Path) -> int | None:
        """The line of ``path``, or of its nearest ancestor that exists."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return None


def parse(text: str) -> Tree:
    """Parse one YAML document. Raises ``yaml.MarkedYAMLError`` on bad syntax;
    structural problems (duplicate keys, non-string keys) go to ``errors``."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as e:
        raise _marked(e, text) from None
    tree = Tree(data=None)
    if root is None:
        return tree
    tree.lines[()] = root.start_mark.line + 1
    tree.data = _Walker(loader, tree).build(root, (), 0)
    return tree


def _marked(e: yaml.reader.ReaderError, text: str) -> yaml.MarkedYAMLError:
    """A character YAML refuses (a control character, say) as a syntax error
    with its line: the reader's own error has only an offset."""
    line = text.count("\n", 0, e.position)
    column = e.position - (text.rfind("\n", 0, e.position) + 1)
    problem = f"character #x{e.character:04x} is not allowed ({e.reason})"
    return yaml.MarkedYAMLError(problem=problem, problem_mark=yaml.Mark(e.name, e.position, line, column, None, 0))


class _TooBig(Exception):
    pass


class _Walker:
    def __init__(self, loader: yaml.SafeLoader, tree: Tree) -> None:
        self.loader = loader
        self.tree = tree
        self.budget = MAX_NODES

    def build(self, node: Node, path: Path, depth: int) -> Any:
        self.budget -= 1
        if self.budget < 0 or depth > MAX_DEPTH:
            raise _TooBig
        if isinstance(node, MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, SequenceNode):
            return self._sequence(node, path, depth)
        assert isinstance(node, ScalarNode)
        return self._scalar(node, path)

    def _mapping(self, node: MappingNode, path: Path, depth: int) -> dict[str, Any]:
        self.loader.flatten_mapping(node)  # resolves `<<: *anchor` merge keys
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, ScalarNode):
                self.tree.errors.append(TreeError(line, path, "a key must be a plain name, not a list or mapping"))
                continue
            key = key_node.value
            key_path = (*path, key)
            if key in out:
                first = self.tree.lines[key_path]
                self.tree.errors.append(TreeError(line, key_path, f"duplicate key '{key}' (first at line {first})"))
                continue
            self.tree.lines[key_path] = line
            out[key] = self.build(value_node, key_path, depth + 1)
        return out

    def _sequence(self, node: SequenceNode, path: Path, depth: int) -> list[Any]:
        items = []
        for index, item in enumerate(node.value):
            item_path = (*path, index)
            self.tree.lines[item_path] = item.start_mark.line + 1
            items.append(self.build(item, item_path, depth + 1))
        return items

    def _scalar(self, node: ScalarNode, path: Path) -> Any:
        if node.tag == _NULL:
            return None
        constructor = {
            _INT: self.loader.construct_yaml_int,
            _FLOAT: self.loader.construct_yaml_float,
            _BOOL: self.loader.construct_yaml_bool,
        }.get(node.tag)
        if constructor is None:
            return node.value
        self.tree.raw[path] = node.value
        return constructor(node)


def parse_checked(text: str) -> Tree:
    """``parse`` that turns an alias bomb into a tree error instead of raising."""
    try:
        return parse(text)
    except _TooBig:
        tree = Tree(data=None)
        tree.errors.append(
            TreeError(
                1, (), f"the file is too large or nests too deep (more than {MAX_NODES} values or {MAX_DEPTH} levels)"
            )
        )
        return tree

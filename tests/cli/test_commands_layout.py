"""The layout of ``trainyard.commands`` (its docstring): ``commands/<name>.py``
is ``trainyard <name>``; the shared modules define no command, and a command
module imports only them."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import trainyard.commands as commands
from trainyard.cli import cli

PACKAGE = Path(commands.__file__).parent
COMMAND_MODULES = sorted({m.name for m in pkgutil.iter_modules(commands.__path__)} - set(commands.SHARED))


def test_each_command_of_trainyard_is_the_module_of_its_name():
    assert sorted(cli.commands) == sorted(name.replace("_", "-") for name in COMMAND_MODULES)
    for name in COMMAND_MODULES:
        command = getattr(importlib.import_module(f"trainyard.commands.{name}"), name)
        assert cli.commands[name.replace("_", "-")] is command


def test_a_command_module_imports_only_the_shared_modules_of_its_package():
    for name in COMMAND_MODULES:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        siblings = {
            alias.name if node.module is None else node.module.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1
            for alias in node.names
        }
        assert siblings <= set(commands.SHARED), f"commands/{name}.py imports {sorted(siblings - set(commands.SHARED))}"

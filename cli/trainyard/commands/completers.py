"""Completers for the commands' arguments (``shell_complete=``), which the
shell's completion script (``trainyard completion``) asks for on Tab: runs,
tags, workflows and environments come from the server's names endpoint (one
small request per Tab, at most 50 names), a workflow to run from the repo's
files.

A completer never fails: without a login, a server or a repo it offers
nothing, and the shell falls back to its own completion."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
from click.shell_completion import CompletionItem

from ..api import LATEST_SUFFIX, TAG_PREFIX
from . import common


def _names(kind: str, prefix: str) -> list[str]:
    """The server's names of ``kind`` starting with ``prefix`` ([] on any failure)."""
    try:
        with common.client() as api:
            return api.names(kind, prefix)
    except Exception:  # completion must never print an error into the shell's line
        return []


def runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """A run: its name, ``tag:NAME`` or ``WORKFLOW@latest``."""
    if incomplete.startswith(TAG_PREFIX):
        tags = _names("tag", incomplete.removeprefix(TAG_PREFIX))
        return [CompletionItem(TAG_PREFIX + name, help="tag") for name in tags]
    if "@" in incomplete:
        workflow = incomplete.split("@", 1)[0]
        return [CompletionItem(f"{workflow}{LATEST_SUFFIX}", help="its newest run")]
    return [CompletionItem(name) for name in _names("run", incomplete)]


def named(kind: str) -> Callable[[click.Context, click.Parameter, str], list[CompletionItem]]:
    """The workspace's names of ``kind`` (workflow, tag or environment)."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        return [CompletionItem(name) for name in _names(kind, incomplete)]

    return complete


def local_workflows(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The workflows of the repo's files (where ``trainyard run`` reads them)."""
    try:
        from trainyard_spec import load_workflows

        from ..code import find_workspace

        root = find_workspace(Path.cwd()).root
        workflows = load_workflows(common.workflow_sources(root))
    except Exception:  # not a repo, an unreadable or broken file: offer nothing
        return []
    return [
        CompletionItem(wf.name, help=(wf.help or "").splitlines()[0] if wf.help else None)
        for wf in workflows.workflows.values()
        if wf.name.startswith(incomplete)
    ]

"""``trainyard workflows``: the repo's workflows as the CLI reads them, with
no server involved."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import click
from trainyard_spec import WorkflowsFile, load_workflows
from trainyard_spec.schema import resource_spec

from ..code import find_workspace
from ..output import print_table, resources
from . import common, options


@click.command()
@options.json_option("Print a JSON list: name, file, line, provider, help, resources, placement, errors.")
def workflows(as_json: bool) -> None:
    """List the repo's workflows: name, provider, resources and help.

    A workflow with errors is listed too (as a warning with its errors):
    `trainyard run` of it fails, the others run. A key its provider ignores,
    as dstack 0.x ignored it (`requirements` on bash), is a warning too.
    """
    file = load_workflows(common.workflow_sources(find_workspace(Path.cwd()).root))
    entries = workflow_entries(file)
    common.warn_ignored(file)
    if as_json:
        common.print_json(entries)
        return
    common.warn_broken(file)
    rows = [[e["name"], e["provider"], resources(e["resources"]), e["help"]] for e in entries if not e["errors"]]
    if rows:
        print_table(["NAME", "PROVIDER", "RESOURCES", "HELP"], rows, tty=sys.stdout.isatty())
    elif not file.broken:
        click.echo("No workflows: add some to .trainyard/workflows.yaml.", err=True)


def workflow_entries(file: WorkflowsFile) -> list[dict[str, Any]]:
    """What ``trainyard workflows --json`` prints: every workflow, valid ones
    with their resources and placement as a run's plan has them (the
    server's ``resources`` and ``placement`` of its jobs, without overrides),
    broken ones with their errors."""
    entries: list[dict[str, Any]] = [
        {
            "name": name,
            "file": file.file_of(name),
            "line": file.line_of(name),
            "provider": wf.provider,
            "help": wf.help or "",
            "resources": dataclasses.asdict(resource_spec(wf.resources)),
            "placement": wf.placement(),
            "errors": [],
        }
        for name, wf in file.workflows.items()
    ]
    for name, errors in file.broken.items():
        first = errors[0]
        entry = {"name": name, "file": first.file, "line": first.line, "provider": "", "help": ""}
        entries.append(entry | {"resources": {}, "placement": {}, "errors": [str(e) for e in errors]})
    return entries

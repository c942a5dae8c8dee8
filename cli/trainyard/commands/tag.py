"""``trainyard tag``: names of runs (``deps: - tag: NAME`` uses the tagged
run's artifacts)."""

from __future__ import annotations

import click

from ..api import Conflict
from ..output import age
from . import common, completers, options


@click.group(cls=common.Group)
def tag() -> None:
    """Name runs (deps: - tag: NAME uses the tagged run's artifacts)."""


@tag.command("add")
@click.argument("name")
@click.argument("run_name", metavar="RUN", shell_complete=completers.runs)
@click.option("--force", is_flag=True, help="Move the tag if it points to another run.")
def tag_add(name: str, run_name: str, force: bool) -> None:
    """Point tag NAME at RUN."""
    api = common.client()
    try:
        added, moved = api.add_tag(name, run_name, force=force)
    except Conflict as e:
        current = next((t["run"] for t in api.list_tags() if t["name"] == name), None)
        raise common.CliError(
            f"tag {name} already points to {current}; use --force to move it" if current else e.message
        ) from None
    click.echo(f"{'Moved tag' if moved else 'Tagged'} {added['name']} → run {added['run']}", err=True)


@tag.command("ls")
@options.json_option("Print the API's tag objects.")
def tag_ls(as_json: bool) -> None:
    """List the workspace's tags."""
    common.print_list(
        common.client().list_tags(),
        lambda t: [t["name"], t["run"], t.get("created_by") or "-", age(t.get("updated_at"))],
        as_json=as_json,
        headers=["TAG", "RUN", "CREATED BY", "UPDATED"],
        empty="No tags yet: tag a run with `trainyard tag add NAME RUN`.",
    )


@tag.command("rm")
@click.argument("name", shell_complete=completers.named("tag"))
def tag_rm(name: str) -> None:
    """Remove tag NAME (the run and its artifacts stay)."""
    common.client().remove_tag(name)
    click.echo(f"Removed tag {name}", err=True)

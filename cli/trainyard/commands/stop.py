"""``trainyard stop``: stop a run."""

from __future__ import annotations

import click

from . import common, completers


@click.command()
@click.argument("run_name", metavar="RUN", shell_complete=completers.runs)
def stop(run_name: str) -> None:
    """Stop RUN (its jobs are killed; the run ends as stopped)."""
    stopped = common.client().stop_run(run_name)
    click.echo(f"Run {stopped['name']}: {stopped['status']}")

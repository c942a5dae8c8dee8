"""``trainyard rerun``: the server runs a run's workflow again from what it
recorded; the CLI follows it as ``run`` does (``submission``)."""

from __future__ import annotations

import click

from . import common, options, submission


@click.command()
@click.argument("run_name", metavar="RUN")
@options.detach_option
def rerun(run_name: str, detach: bool) -> None:
    """Run RUN's workflow again: the same code, workflows files and values,
    and each job's environment installed from RUN's recorded lock (nothing is
    resolved again), then follow it as `trainyard run` does."""
    api = common.client()
    created = api.rerun(run_name)
    submission.follow_submitted(api, created, f"Run {created['name']} submitted: a re-run of {run_name}", detach=detach)

"""``trainyard rerun``: the server runs a run's workflow again from what it
recorded; the CLI follows it as ``run`` does (``submission``)."""

from __future__ import annotations

from typing import cast

import click

from ..api import Run
from . import common, completers, options, submission


@click.command()
@click.argument("run_name", metavar="RUN", shell_complete=completers.runs)
@options.detach_option
def rerun(run_name: str, detach: bool) -> None:
    """Run RUN's workflow again: the same code, workflows files and values,
    and each job's environment installed from RUN's recorded lock (nothing is
    resolved again), and each data input read as RUN read it where its bucket
    keeps versions (a warning names the ones read as they are now), then
    follow it as `trainyard run` does. A run the budget stopped resumes in
    place instead: its stopped jobs continue from their latest checkpoints
    (waiting for budget while one that applies is still reached)."""
    api = common.client()
    created = api.rerun(run_name)
    for notice in created.get("notices") or []:
        common.warn(notice)
    # The answer is the run as its page shows it (its jobs also with their data and
    # volumes, which following does not read) and the notices.
    run = cast(Run, created)
    resumed: list[str] = list(created.get("resumed") or [])
    if resumed:
        jobs = ", ".join(resumed)
        announcement = (
            f"Run {created['name']} resumed in place (it was stopped by the budget): "
            f"{jobs} continue{'s' if len(resumed) == 1 else ''} from the latest checkpoint"
        )
    else:
        announcement = f"Run {created['name']} submitted: a re-run of {run_name}"
    submission.follow_submitted(api, run, announcement, detach=detach)

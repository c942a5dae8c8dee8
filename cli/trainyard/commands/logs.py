"""``trainyard logs``: a run's log lines, stored and (``-f``) live; a job
reused from the cache shows its source job's log."""

from __future__ import annotations

import sys

import click

from ..api import FINISHED, Client, Job
from ..follow import job_prefixes
from ..output import AttemptMarks, LogWriter, reused_header
from . import common


@click.command()
@click.argument("run_name", metavar="RUN")
@click.option("-f", "--follow", "follow_", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option(
    "--no-source",
    is_flag=True,
    help="For a job reused from the cache, print only the line naming its source run, not that run's log.",
)
def logs(run_name: str, follow_: bool, no_source: bool) -> None:
    """Print the log lines of every job of RUN.

    A finished job's log is streamed whole to stdout, both of its outputs in
    the order printed; a live job's lines go to stdout and stderr as printed.
    A job reused from the cache ran in an earlier run: its log is that run's
    job's, under a line naming the run."""
    api = common.client()
    current = api.get_run(run_name)
    writer, seen, prefixes = LogWriter(), {}, job_prefixes(current)
    for job in current["jobs"]:
        if job.get("cached_from"):
            _print_reused(api, writer, job, prefix=prefixes.get(job["id"], ""), source=not no_source)
            continue
        prefix = prefixes.get(job["id"], "")
        if job.get("status") in FINISHED:
            _print_raw(api, job["id"], prefix=prefix)
            seen[job["id"]] = job.get("last_seq") or 0
        else:
            marks = AttemptMarks(job)
            for page in api.iter_job_logs(job["id"], limit=10000):
                writer.write(marks.around((line["seq"], line["stream"], prefix + line["text"]) for line in page))
                seen[job["id"]] = page[-1]["seq"]
            writer.write(marks.rest())
        if job.get("log_note"):  # on stderr: stdout stays the job's output
            click.echo(f"trainyard: {prefix}{job['log_note']}", err=True)
    if follow_ and current["status"] not in FINISHED:
        shown = {j["id"] for j in current["jobs"] if j.get("cached_from")}

        def reused(job: Job) -> None:
            prefix = job_prefixes(api.get_run(run_name)).get(job["id"], "")
            _print_reused(api, writer, job, prefix=prefix, source=not no_source)

        common.follow(api, current["name"], seen=seen, on_reused=reused, announced=shown)


def _print_reused(api: Client, writer: LogWriter, job: Job, *, prefix: str, source: bool) -> None:
    """A cached job's header, then (``source``) its source job's whole log."""
    writer.write([("o", prefix + reused_header(job))])
    if not source:
        return
    cache = job["cached_from"]
    assert cache is not None
    _print_raw(api, cache["job"], prefix=prefix)


def _print_raw(api: Client, job_id: str, *, prefix: str) -> None:
    """A finished job's whole log, as the server's raw read-back streams it
    (both streams in the order printed, attempt marks included), to stdout."""
    sys.stdout.flush()
    sys.stderr.flush()
    out = sys.stdout.buffer
    api.job_raw_log(job_id, out, prefix=prefix)
    out.flush()

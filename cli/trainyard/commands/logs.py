"""``trainyard logs``: a run's log lines, stored and (``-f``) live; a job
reused from the cache shows its source job's log. ``--job``, ``--tail``,
``--timestamps`` and ``--attempt`` narrow what is printed; the server cuts
the window (the raw read-back's ``from_seq``/``to_seq``/``tail``/
``timestamps``, the lines page's ``tail``), so a long log is never read whole
for its last lines."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import click

from ..api import FINISHED, Client, Job, LogLine, Run
from ..apitypes import AttemptOut
from ..follow import job_prefixes
from ..output import AttemptMarks, LogWriter, line_stamp, reused_header
from . import common, completers


@dataclass(frozen=True)
class Window:
    """Which lines of each job are printed: the last ``tail`` of them, of
    attempt ``attempt`` only, each starting with its time (``timestamps``)."""

    tail: int | None = None
    timestamps: bool = False
    attempt: int | None = None

    @property
    def narrowed(self) -> bool:
        return self.tail is not None or self.attempt is not None


@click.command()
@click.argument("run_name", metavar="RUN", shell_complete=completers.runs)
@click.option("-f", "--follow", "follow_", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option(
    "--job",
    "job_names",
    multiple=True,
    metavar="NAME",
    help="Only this job's log (repeatable; `trainyard show RUN` lists the run's jobs).",
)
@click.option(
    "--tail",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Only the last N lines of each job's log (with -f, then the new ones).",
)
@click.option(
    "-t", "--timestamps", is_flag=True, help="Start each line with its UTC time, e.g. 2026-12-02T12:00:00.123456Z."
)
@click.option(
    "--attempt",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Only the lines of each job's attempt N (a job retried after an interruption has several; not with -f).",
)
@click.option(
    "--no-source",
    is_flag=True,
    help="For a job reused from the cache, print only the line naming its source run, not that run's log.",
)
def logs(
    run_name: str,
    follow_: bool,
    job_names: tuple[str, ...],
    tail: int | None,
    timestamps: bool,
    attempt: int | None,
    no_source: bool,
) -> None:
    """Print the log lines of every job of RUN.

    RUN is a run's name, tag:NAME (the run a tag points at) or
    WORKFLOW@latest (the workflow's newest run). A finished job's log is
    streamed to stdout, both of its outputs in the order printed; a live
    job's lines go to stdout and stderr as printed. A job reused from the
    cache ran in an earlier run: its log is that run's job's, under a line
    naming the run."""
    if attempt is not None and follow_:
        raise click.UsageError("--attempt prints an attempt's stored lines; follow the run (-f) without it")
    window = Window(tail=tail, timestamps=timestamps, attempt=attempt)
    api = common.client()
    current = api.get_run(run_name)
    jobs = _jobs_named(current, job_names)
    writer, seen, prefixes = LogWriter(), {}, job_prefixes(current)
    for job in jobs:
        prefix = prefixes.get(job["id"], "")
        if job.get("cached_from"):
            if attempt is not None:
                click.echo(f"trainyard: {prefix}{job['name']} was reused from the cache: it has no attempts", err=True)
            else:
                _print_reused(api, writer, job, prefix=prefix, source=not no_source, window=window)
            continue
        if attempt is not None and _attempt_of(job, attempt, single=len(jobs) == 1) is None:
            continue
        seen[job["id"]] = job.get("last_seq") or 0
        if job.get("status") in FINISHED:
            _print_raw(api, job, prefix=prefix, window=window)
        else:  # a live job stores lines while they are read: follow on from the last one printed
            seen[job["id"]] = max(seen[job["id"]], _print_live(api, writer, job, prefix=prefix, window=window))
        if job.get("log_note"):  # on stderr: stdout stays the job's output
            click.echo(f"trainyard: {prefix}{job['log_note']}", err=True)
    if follow_ and current["status"] not in FINISHED:
        # The jobs not asked for are not read again from their start: only their new lines, unprinted.
        seen |= {job["id"]: job.get("last_seq") or 0 for job in current["jobs"] if job["id"] not in seen}
        wanted = {job["id"] for job in jobs}
        shown = {j["id"] for j in current["jobs"] if j.get("cached_from")}

        def reused(job: Job) -> None:
            if job["id"] in wanted or not job_names:
                prefix = job_prefixes(api.get_run(run_name)).get(job["id"], "")
                _print_reused(api, writer, job, prefix=prefix, source=not no_source, window=window)

        common.follow(
            api,
            current["name"],
            seen=seen,
            on_reused=reused,
            announced=shown,
            only=wanted if job_names else None,
            timestamps=timestamps,
        )


def _jobs_named(run: Run, names: tuple[str, ...]) -> list[Job]:
    """The run's jobs named by ``--job`` (all without it), in the run's order."""
    jobs = list(run["jobs"])
    if not names:
        return jobs
    known = [job["name"] for job in jobs]
    unknown = [name for name in dict.fromkeys(names) if name not in known]
    if unknown:
        raise common.CliError(f"run {run['name']} has no job {unknown[0]!r}; its jobs: {', '.join(known)}")
    return [job for job in jobs if job["name"] in names]


def _attempt_of(job: Job, number: int, *, single: bool) -> AttemptOut | None:
    """Attempt ``number`` of ``job``; without one, an error when the job was
    named alone, else a note on stderr and None (the job is skipped)."""
    attempts = sorted(job.get("attempts") or [], key=lambda a: a["number"])
    found = next((a for a in attempts if a["number"] == number), None)
    if found is None:
        had = f"attempts 1 to {len(attempts)}" if len(attempts) > 1 else f"{len(attempts) or 'no'} attempt"
        message = f"job {job['name']} has no attempt {number} (it has {had})"
        if single:
            raise common.CliError(message)
        click.echo(f"trainyard: {message}", err=True)
    return found


def _raw_window(job: Job, window: Window) -> dict[str, int] | None:
    """The raw read-back's parameters for ``window`` of ``job`` (None: nothing to read)."""
    params: dict[str, int] = {}
    if window.attempt is not None:
        attempt = next(a for a in job.get("attempts") or [] if a["number"] == window.attempt)
        first, last = int(attempt.get("first_seq") or 1), attempt.get("last_seq")
        if last is not None and int(last) < first:
            return None  # the attempt stored no line
        params["from_seq"] = first
        if last is not None:
            params["to_seq"] = int(last)
    if window.tail is not None:
        if window.tail == 0:
            return None
        params["tail"] = window.tail
    if window.timestamps:
        params["timestamps"] = 1
    return params


def _print_live(api: Client, writer: LogWriter, job: Job, *, prefix: str, window: Window) -> int:
    """A live job's stored lines, stdout and stderr as printed (with attempt
    marks when it ran more than once and all of its log is shown); the seq
    of the last line printed (0: none)."""
    stamped, last = window.timestamps, 0
    marks = AttemptMarks(job) if not window.narrowed else None
    for page in _live_pages(api, job, window):
        lines = [
            (line["seq"], line["stream"], prefix + (line_stamp(line["ts"]) if stamped else "") + line["text"])
            for line in page
        ]
        writer.write(marks.around(lines) if marks else ((stream, text) for _, stream, text in lines))
        last = page[-1]["seq"]
    if marks:
        writer.write(marks.rest())
    return last


def _live_pages(api: Client, job: Job, window: Window) -> Iterator[list[LogLine]]:
    """The pages of a live job's lines that ``window`` asks for."""
    if window.tail == 0:
        return
    if window.attempt is None:
        if window.tail is not None:
            page = api.job_logs(job["id"], tail=window.tail)["lines"]
            if page:
                yield page
            return
        yield from api.iter_job_logs(job["id"], limit=10000)
        return
    attempts = sorted(job.get("attempts") or [], key=lambda a: a["number"])
    attempt = next(a for a in attempts if a["number"] == window.attempt)
    # The latest attempt of a live job is still writing: every line after its first is its.
    last = None if attempt is attempts[-1] else attempt.get("last_seq")
    lines = [
        line
        for page in api.iter_job_logs(job["id"], after_seq=int(attempt.get("first_seq") or 1) - 1, limit=10000)
        for line in page
        if last is None or line["seq"] <= int(last)
    ]
    if window.tail is not None:
        lines = lines[-window.tail :]
    if lines:
        yield lines


def _print_reused(api: Client, writer: LogWriter, job: Job, *, prefix: str, source: bool, window: Window) -> None:
    """A cached job's header, then (``source``) its source job's log."""
    writer.write([("o", prefix + reused_header(job))])
    if not source:
        return
    cache = job["cached_from"]
    assert cache is not None
    params = _raw_window({**job, "attempts": []}, Window(tail=window.tail, timestamps=window.timestamps))
    if params is not None:
        _stream_raw(api, cache["job"], prefix=prefix, params=params)


def _print_raw(api: Client, job: Job, *, prefix: str, window: Window) -> None:
    """A finished job's log as the server's raw read-back streams it (both
    streams in the order printed, attempt marks included), to stdout."""
    params = _raw_window(job, window)
    if params is not None:
        _stream_raw(api, job["id"], prefix=prefix, params=params)


def _stream_raw(api: Client, job_id: str, *, prefix: str, params: dict[str, int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    out = sys.stdout.buffer
    api.job_raw_log(job_id, out, prefix=prefix, window=params)
    out.flush()

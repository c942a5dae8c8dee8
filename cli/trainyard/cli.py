"""The ``trainyard`` command.

Exit codes: 0 success; 1 an error (bad workflow file, server error, server
unreachable, missing token, a failed or stopped run without an exit code);
2 bad usage; ``trainyard run`` returns the exit code of the first job that
failed with one; 130 when following is interrupted with Ctrl-C (the run
continues). The CLI's own messages go to stderr; stdout carries the job's
stdout, tables, JSON, and the run name of ``run -d``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn, cast

import click
from trainyard_spec import (
    Source,
    WorkflowFileError,
    WorkflowsFile,
    find_variables_file,
    find_workflows_files,
    inherited_env_names,
    load_variables,
    load_workflows,
    resolve_run_plan,
    run_workflows,
)
from trainyard_spec.environments import environment_files
from trainyard_spec.schema import BACKEND_KINDS, resource_spec

from . import __version__
from .api import FINISHED, ApiError, Artifact, Client, Conflict, Job, Run, RunSubmission, Secret
from .code import CodeError, code_digests, find_workspace, keep_out_of_git, prepare_code, remote_url
from .config import DEFAULT_URL, ConfigError, load_config, save_config
from .follow import Follower, job_prefixes
from .guard import DEFAULT_WARN_BYTES, WARN_ENV, CodeTooLarge, SizeGuard, parse_size
from .output import (
    PLAN_HEADERS,
    AttemptMarks,
    LogWriter,
    StatusDisplay,
    age,
    attempt_rows,
    cache_lines,
    dag_rows,
    duration,
    environment_lines,
    input_lines,
    offer_rows,
    plan_lines,
    port_lines,
    print_table,
    rerun_line,
    resources,
    reused_artifact_lines,
    reused_header,
    reused_words,
    size,
    truncate,
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CliError(click.ClickException):
    """An error shown as ``error: message`` plus detail lines, exit code 1."""

    def __init__(self, message: str, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.details = details or []

    def show(self, file: Any = None) -> None:
        lines = [f"error: {self.message}"] if self.message else []
        click.echo("\n".join([*lines, *self.details]), err=True)


class _Group(click.Group):
    """Turns the SDK's exceptions into CliError: a message, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except WorkflowFileError as e:
            raise CliError("", [str(err) for err in e.errors]) from None
        except ApiError as e:
            raise CliError(e.message, [_format_server_error(err) for err in e.errors]) from None
        except CodeTooLarge as e:
            raise CliError(str(e), e.details) from None
        except (ConfigError, CodeError) as e:
            raise CliError(str(e)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainyard")
def cli() -> None:
    """Run ML training workflows on Trainyard.

    Configuration: TRAINYARD_URL, TRAINYARD_TOKEN, TRAINYARD_WORKSPACE
    (or `trainyard login`).
    """


def main() -> None:
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")  # a job's odd bytes must not crash the CLI
    cli(prog_name="trainyard")


# ---------------------------------------------------------------- run


@cli.command()
@click.argument("workflow")
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS]")
@click.option("-d", "--detach", is_flag=True, help="Submit and return at once; prints the run name last.")
@click.option(
    "-e",
    "--env",
    "env_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set an environment variable in every job of the run (repeatable); also the value of ${{ variables.KEY }}.",
)
@click.option("--upload", is_flag=True, help="Upload the working tree instead of referencing the git remote.")
@click.option(
    "--no-cache", is_flag=True, help="Run every job, even those an earlier run's artifacts could stand in for."
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan (jobs, dependencies, resources, cache hits, cheapest offer) and submit nothing.",
)
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="KIND",
    help="Only these backends (repeatable or comma-separated: aws,local); overrides the workflows' backends.",
)
@click.option(
    "--region",
    "regions",
    multiple=True,
    metavar="REGION",
    help="Only these regions (repeatable or comma-separated); overrides the workflows' regions.",
)
@click.option(
    "--spot-policy", type=click.Choice(["spot", "on-demand", "auto"]), default=None, help="Overrides spot_policy."
)
@click.option(
    "--max-price", type=click.FloatRange(min=0, min_open=True), default=None, help="USD per hour; overrides max_price."
)
@click.option(
    "--code-warn-size",
    metavar="SIZE",
    default=None,
    help=f"Ask before uploading more code than this beyond the commit (default {WARN_ENV} or 20MiB).",
)
@click.option("-y", "--yes", is_flag=True, help="Upload the code without asking, however large (it still warns).")
def run(
    workflow: str,
    run_args: tuple[str, ...],
    detach: bool,
    env_pairs: tuple[str, ...],
    upload: bool,
    no_cache: bool,
    dry_run: bool,
    backends: tuple[str, ...],
    regions: tuple[str, ...],
    spot_policy: str | None,
    max_price: float | None,
    code_warn_size: str | None,
    yes: bool,
) -> None:
    """Run WORKFLOW from the repo's workflows files and follow it.

    The files: .trainyard/workflows.yaml, .dstack/workflows.yaml and every
    .yaml in .trainyard/workflows/ and .dstack/workflows/ (docs/WORKFLOWS.md).
    The workflows it depends on (deps: - workflow: X) run first, as jobs of
    the same run, unless an earlier run with the same inputs can be reused.
    What follows -- is ${{ run.args }} in the commands. --backend, --region,
    --spot-policy and --max-price apply to every job of the run, over what
    the workflows say. The code beyond the commit (or the archive) is
    checked before it is uploaded: over --code-warn-size the run lists the
    largest files and asks (not with --yes or without a terminal); over the
    server's limit it is refused. .trainyardignore leaves files out.
    """
    warn_bytes = _warn_size(code_warn_size)
    env = _parse_env(env_pairs)
    placement = _placement(backends, regions, spot_policy, max_price)
    workspace = find_workspace(Path.cwd())
    sources = _workflow_sources(workspace.root)
    file = load_workflows(sources)
    names = [wf.name for wf in run_workflows(file, workflow)]
    variables = _variables(workspace.root, names)
    # Only the bare env names of this run's workflows leave this machine.
    inherited = {n: os.environ[n] for n in inherited_env_names(file, workflow) if n in os.environ}
    plan = resolve_run_plan(
        file, workflow, env_overrides=env, inherited_env=inherited, run_args=list(run_args), variables=variables
    )
    _warn_broken(file)
    client = _client()
    submit: RunSubmission = {
        "workflow": workflow,
        "workflows_files": [{"path": s.path, "text": s.text} for s in sources],
        "env": env,
        "inherited_env": inherited,
        "run_args": list(run_args),
        "variables": variables,
        "no_cache": no_cache,
        "placement": placement,
        "environment_files": environment_files_of_plan(workspace.root, plan),
    }
    guard = SizeGuard(
        warn_bytes=warn_bytes,
        hard_bytes=client.server_info().get("max_blob_bytes"),
        ask=None if (yes or dry_run or not sys.stdin.isatty()) else _confirm,
        warn=_warn_lines,
    )
    if dry_run:
        planned = client.plan_run(code=code_digests(workspace, force_upload=upload, warn=_warn, check=guard), **submit)
        local_help = file.get(workflow).help or ""
        click.echo("\n".join(plan_lines({**planned, "help": planned.get("help") or local_help})))
        click.echo("Nothing was submitted.", err=True)
        return
    code = prepare_code(workspace, force_upload=upload, upload_blob=client.upload_blob, warn=_warn, check=guard)
    created = client.create_run(code=code, **submit)
    jobs = f" ({len(plan.jobs)} jobs: {', '.join(job.name for job in plan.jobs)})" if len(plan.jobs) > 1 else ""
    click.echo(f"Run {created['name']} submitted{jobs}", err=True)
    offers = cast(dict[str, Any], created).get("plan")  # the creation answer only
    if offers:
        print_table(PLAN_HEADERS, offer_rows(offers), tty=sys.stderr.isatty(), out=sys.stderr)
    if detach:
        click.echo(created["name"])
        return
    final = _follow(client, created["name"], seen={}, on_reused=_note_reused)
    _reused_summary(client, final)
    sys.exit(run_exit_code(final))


@cli.command()
@click.argument("run_name", metavar="RUN")
@click.option("-d", "--detach", is_flag=True, help="Submit and return at once; prints the run name last.")
def rerun(run_name: str, detach: bool) -> None:
    """Run RUN's workflow again: the same code, workflows files and values,
    and each job's environment installed from RUN's recorded lock (nothing is
    resolved again), then follow it as `trainyard run` does."""
    client = _client()
    created = client.rerun(run_name)
    click.echo(f"Run {created['name']} submitted: a re-run of {run_name}", err=True)
    if detach:
        click.echo(created["name"])
        return
    final = _follow(client, created["name"], seen={}, on_reused=_note_reused)
    _reused_summary(client, final)
    sys.exit(run_exit_code(final))


@cli.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print a JSON list: name, file, line, provider, help, resources, placement, errors.",
)
def workflows(as_json: bool) -> None:
    """List the repo's workflows: name, provider, resources and help.

    A workflow with errors is listed too (as a warning with its errors):
    `trainyard run` of it fails, the others run.
    """
    file = load_workflows(_workflow_sources(find_workspace(Path.cwd()).root))
    entries = workflow_entries(file)
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    _warn_broken(file)
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


def _workflow_sources(root: Path) -> list[Source]:
    return [Source(p.relative_to(root).as_posix(), _read_text(p)) for p in find_workflows_files(root)]


def _variables(root: Path, workflows: list[str]) -> dict[str, dict[str, str]]:
    """Each of ``workflows``' values of ${{ variables.NAME }} from the variables file."""
    path = find_variables_file(root)
    if path is None:
        return {}
    variables = load_variables(_read_text(path), path=path.relative_to(root).as_posix())
    return {name: values for name in workflows if (values := variables.of(name))}


def environment_files_of_plan(root: Path, plan: Any) -> dict[str, dict[str, str]]:
    """{requirements file: {path: sha256}} for the environments of ``plan``'s
    jobs, read from the working tree (what the runner's checkout will hold):
    the server names a changed file as the reason a job is not reused, and
    ``--dry-run`` looks the environment up (docs/ENVIRONMENTS.md)."""
    base = root.resolve()

    def read(name: str) -> bytes | None:
        path = (base / name).resolve()
        if not path.is_relative_to(base):
            return None
        try:
            return path.read_bytes()
        except OSError:
            return None

    named = {str(job.environment["requirements"]) for job in plan.jobs if (job.environment or {}).get("requirements")}
    return {name: environment_files(name, read) for name in sorted(named)}


def _warn_broken(file: WorkflowsFile) -> None:
    for name, errors in file.broken.items():
        _warn(f"workflow '{name}' cannot be run:")
        click.echo("\n".join(f"  {e}" for e in errors), err=True)


def _warn_size(option: str | None) -> int:
    """The soft limit: --code-warn-size, else $TRAINYARD_CODE_WARN_SIZE, else 20 MiB."""
    if option is not None:
        try:
            return parse_size(option)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--code-warn-size") from None
    if not os.environ.get(WARN_ENV):
        return DEFAULT_WARN_BYTES
    try:
        return parse_size(os.environ[WARN_ENV])
    except ValueError as e:
        raise CliError(f"{WARN_ENV}: {e}; fix or unset it") from None


def _confirm(question: str) -> bool:
    return click.confirm(question, default=False, err=True)


def _placement(
    backends: tuple[str, ...], regions: tuple[str, ...], spot_policy: str | None, max_price: float | None
) -> dict[str, Any]:
    """The placement overrides the options give (only those given)."""
    kinds = [k.strip() for item in backends for k in item.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in BACKEND_KINDS]
    if unknown:
        raise click.BadParameter(
            f"unknown backend {unknown[0]!r}; known backends: {', '.join(BACKEND_KINDS)}", param_hint="--backend"
        )
    names = [r.strip() for item in regions for r in item.split(",") if r.strip()]
    values: dict[str, Any] = {"backends": list(dict.fromkeys(kinds)), "regions": list(dict.fromkeys(names))}
    values |= {"spot_policy": spot_policy, "max_price": max_price}
    return {k: v for k, v in values.items() if v not in (None, [])}


def run_exit_code(run: Run) -> int:
    """0 if succeeded; the exit code of the first job (by finish time) that
    failed with one; else 1."""
    if run["status"] == "succeeded":
        return 0
    if run["status"] == "failed":
        failed = sorted(
            (j for j in run["jobs"] if j.get("status") == "failed"), key=lambda j: j.get("finished_at") or "~"
        )
        codes = [j.get("exit_code") for j in failed] + [run.get("exit_code")]
        code = next((c for c in codes if isinstance(c, int) and c != 0), None)
        if code is not None:
            return code if 0 < code < 256 else 1
    return 1


# ---------------------------------------------------------------- ps, stop


@cli.command()
@click.option("-a", "--all", "show_all", is_flag=True, help="All runs, not only the most recent ones.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's run objects as a JSON list.")
@click.option(
    "-n", "limit", type=click.IntRange(min=1), default=None, help="At most N runs (default 20; no limit with -a)."
)
def ps(show_all: bool, as_json: bool, limit: int | None) -> None:
    """List runs, newest first."""
    client = _client()
    limit = limit if limit is not None else (None if show_all else 20)
    runs = list(itertools.islice(client.iter_runs(page_size=min(limit or 100, 100)), limit))
    if as_json:
        click.echo(json.dumps(runs, indent=2))
        return
    if not runs:
        click.echo("No runs yet: start one with `trainyard run WORKFLOW`.", err=True)
        return
    reasons = [_shown_reason(r) for r in runs]
    headers = ["NAME", "WORKFLOW", "STATUS", "SUBMITTED", "DURATION"] + (["REASON"] if any(reasons) else [])
    rows = [
        [r["name"], r["workflow"], r["status"], age(r.get("created_at")), duration(r.get("duration_seconds"))]
        + ([truncate(reason)] if any(reasons) else [])
        for r, reason in zip(runs, reasons, strict=True)
    ]
    print_table(headers, rows, tty=sys.stdout.isatty())


@cli.command()
@click.argument("run_name", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Print the API's run object.")
def show(run_name: str, as_json: bool) -> None:
    """Show RUN's jobs: dependencies, status, timing, cache and artifacts."""
    client = _client()
    current = client.get_run(run_name)
    if as_json:
        click.echo(json.dumps(current, indent=2))
        return
    reason = f" ({current['status_reason']})" if current.get("status_reason") else ""
    click.echo(f"Run {current['name']} of {current['workflow']}: {current['status']}{reason}")
    if rerun := rerun_line(current):
        click.echo(rerun)
    headers = ["JOB", "STATUS", "NEEDS", "STARTED", "DURATION", "CACHED FROM", "ARTIFACTS"]
    print_table(headers, dag_rows(current, client.list_artifacts(run_name)), tty=sys.stdout.isatty())
    attempts = attempt_rows(current)
    if attempts:
        click.echo("\nAttempts:")
        headers = ["JOB", "ATTEMPT", "INSTANCE", "WHERE", "STARTED", "ENDED", "REASON"]
        print_table(headers, attempts, tty=sys.stdout.isatty())
    notes = [f"  {j['name']}: {j['placement_note']}" for j in current.get("jobs") or [] if j.get("placement_note")]
    if notes:
        click.echo("\n".join(["", "Placement:", *notes]))
    cache = cache_lines(current)
    if cache:
        click.echo("\n".join(["", "Cache:", *cache]))
    log_notes = [f"  {j['name']}: {j['log_note']}" for j in current.get("jobs") or [] if j.get("log_note")]
    if log_notes:
        click.echo("\n".join(["", "Logs:", *log_notes]))
    ports = port_lines(current)
    if ports:
        click.echo("\n".join(["", "Ports:", *ports]))
    inputs = input_lines(current)
    if inputs:
        click.echo("\n".join(["", "Inputs:", *inputs]))
    environments = environment_lines(current)
    if environments:
        click.echo("\n".join(["", "Environments (trainyard env show KEY):", *environments]))


@cli.command()
@click.argument("run_name", metavar="RUN")
def stop(run_name: str) -> None:
    """Stop RUN (its jobs are killed; the run ends as stopped)."""
    stopped = _client().stop_run(run_name)
    click.echo(f"Run {stopped['name']}: {stopped['status']}")


# ---------------------------------------------------------------- logs


@cli.command()
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
    client = _client()
    current = client.get_run(run_name)
    writer, seen, prefixes = LogWriter(), {}, job_prefixes(current)
    for job in current["jobs"]:
        if job.get("cached_from"):
            _print_reused(client, writer, job, prefix=prefixes.get(job["id"], ""), source=not no_source)
            continue
        prefix = prefixes.get(job["id"], "")
        if job.get("status") in FINISHED:
            _print_raw(client, job["id"], prefix=prefix)
            seen[job["id"]] = job.get("last_seq") or 0
        else:
            marks = AttemptMarks(job)
            for page in client.iter_job_logs(job["id"], limit=10000):
                writer.write(marks.around((line["seq"], line["stream"], prefix + line["text"]) for line in page))
                seen[job["id"]] = page[-1]["seq"]
            writer.write(marks.rest())
        if job.get("log_note"):  # on stderr: stdout stays the job's output
            click.echo(f"trainyard: {prefix}{job['log_note']}", err=True)
    if follow_ and current["status"] not in FINISHED:
        shown = {j["id"] for j in current["jobs"] if j.get("cached_from")}

        def reused(job: Job) -> None:
            prefix = job_prefixes(client.get_run(run_name)).get(job["id"], "")
            _print_reused(client, writer, job, prefix=prefix, source=not no_source)

        _follow(client, current["name"], seen=seen, on_reused=reused, announced=shown)


def _print_reused(client: Client, writer: LogWriter, job: Job, *, prefix: str, source: bool) -> None:
    """A cached job's header, then (``source``) its source job's whole log."""
    writer.write([("o", prefix + reused_header(job))])
    if not source:
        return
    cache = job["cached_from"]
    assert cache is not None
    _print_raw(client, cache["job"], prefix=prefix)


def _print_raw(client: Client, job_id: str, *, prefix: str) -> None:
    """A finished job's whole log, as the server's raw read-back streams it
    (both streams in the order printed, attempt marks included), to stdout."""
    sys.stdout.flush()
    sys.stderr.flush()
    out = sys.stdout.buffer
    client.job_raw_log(job_id, out, prefix=prefix)
    out.flush()


# ---------------------------------------------------------------- artifacts


@cli.group(cls=_Group)
def artifacts() -> None:
    """List and download the artifacts of a run."""


@artifacts.command("list")
@click.argument("run_name", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Print the API's artifact objects.")
def artifacts_list(run_name: str, as_json: bool) -> None:
    """List the files of RUN's artifacts."""
    found = _client().list_artifacts(run_name)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    rows = [
        [
            a["path"] + ("" if a["status"] == "complete" else f" ({a['status']})"),
            f["path"],
            size(f["size"]),
            f["sha256"][:12],
        ]
        for a in found
        for f in a["files"]
    ]
    if not rows:
        click.echo(f"Run {run_name} has no artifacts.", err=True)
        return
    print_table(["ARTIFACT", "FILE", "SIZE", "SHA256"], rows, tty=sys.stdout.isatty())


@artifacts.command("download")
@click.argument("run_name", metavar="RUN")
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Directory to write into.",
)
def artifacts_download(run_name: str, out_dir: Path) -> None:
    """Download every file of RUN's artifacts to OUTPUT/<artifact>/<file>,
    checking each file's size and sha256.

    Inside a git working tree, the files are added to the repo's
    .git/info/exclude, so they do not change the code your next runs ship
    (and their cache keys)."""
    client = _client()
    found = client.list_artifacts(run_name)
    incomplete = [a for a in found if a["status"] != "complete"]
    for artifact in incomplete:
        _warn(f"artifact {artifact['path']} is still {artifact['status']}; skipped")
    count, total, written = 0, 0, []
    try:
        for artifact in found:
            if artifact["status"] == "complete":
                for dest, nbytes in _download_artifact(client, artifact, out_dir.resolve()):
                    click.echo(f"{_display_path(dest)}  {size(nbytes)}")
                    count, total = count + 1, total + nbytes
                    written.append(dest)
    finally:
        _keep_out_of_code(out_dir, written)
    click.echo(f"Downloaded {count} file{'s' * (count != 1)} ({size(total)}) to {out_dir}", err=True)
    if incomplete:
        raise CliError(
            f"{len(incomplete)} artifact(s) of run {run_name} are not complete yet; try again when the run has finished"
        )


def _keep_out_of_code(out_dir: Path, written: list[Path]) -> None:
    kept = keep_out_of_git(out_dir, written) if written else None
    if kept and kept[1]:
        exclude, lines = kept
        click.echo(
            f"Added {', '.join(lines)} to {_display_path(exclude)}: downloads do not change your runs' code",
            err=True,
        )


# ---------------------------------------------------------------- tags


@cli.group(cls=_Group)
def tag() -> None:
    """Name runs (deps: - tag: NAME uses the tagged run's artifacts)."""


@tag.command("add")
@click.argument("name")
@click.argument("run_name", metavar="RUN")
@click.option("--force", is_flag=True, help="Move the tag if it points to another run.")
def tag_add(name: str, run_name: str, force: bool) -> None:
    """Point tag NAME at RUN."""
    client = _client()
    try:
        added, moved = client.add_tag(name, run_name, force=force)
    except Conflict as e:
        current = next((t["run"] for t in client.list_tags() if t["name"] == name), None)
        raise CliError(
            f"tag {name} already points to {current}; use --force to move it" if current else e.message
        ) from None
    click.echo(f"{'Moved tag' if moved else 'Tagged'} {added['name']} → run {added['run']}", err=True)


@tag.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the API's tag objects.")
def tag_ls(as_json: bool) -> None:
    """List the workspace's tags."""
    tags = _client().list_tags()
    if as_json:
        click.echo(json.dumps(tags, indent=2))
        return
    if not tags:
        click.echo("No tags yet: tag a run with `trainyard tag add NAME RUN`.", err=True)
        return
    rows = [[t["name"], t["run"], t.get("created_by") or "-", age(t.get("updated_at"))] for t in tags]
    print_table(["TAG", "RUN", "CREATED BY", "UPDATED"], rows, tty=sys.stdout.isatty())


@tag.command("rm")
@click.argument("name")
def tag_rm(name: str) -> None:
    """Remove tag NAME (the run and its artifacts stay)."""
    _client().remove_tag(name)
    click.echo(f"Removed tag {name}", err=True)


# ---------------------------------------------------------------- environments


@cli.group(cls=_Group)
def env() -> None:
    """The environments the workspace's runners built (docs/ENVIRONMENTS.md)."""


@env.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the API's environment objects.")
def env_ls(as_json: bool) -> None:
    """List the workspace's environments, last used first."""
    found = _client().list_environments()
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo("No environments yet: a workflow with requirements or environment: builds one.", err=True)
        return
    rows = [
        [
            e["key"],
            size(e.get("size_bytes")),
            str(e.get("packages", 0)),
            f"{e.get('build_seconds', 0):.1f}s",
            e.get("built_on") or "-",
            str(e.get("runs", 0)),
            "yes" if e.get("stored") else "no",
            age(e.get("last_used_at")),
        ]
        for e in found
    ]
    headers = ["KEY", "SIZE", "PACKAGES", "BUILD", "BUILT ON", "RUNS", "STORED", "LAST USED"]
    print_table(headers, rows, tty=sys.stdout.isatty())


@env.command("build")
@click.argument("workflow")
@click.option("-d", "--detach", is_flag=True, help="Submit and return at once; prints the run name last.")
@click.option("--upload", is_flag=True, help="Upload the working tree instead of referencing the git remote.")
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="KIND",
    help="Build on these backends only (repeatable or comma-separated); overrides the workflow's backends.",
)
@click.option("--region", "regions", multiple=True, metavar="REGION", help="Only these regions (repeatable).")
@click.option("-y", "--yes", is_flag=True, help="Upload the code without asking, however large (it still warns).")
def env_build(
    workflow: str, detach: bool, upload: bool, backends: tuple[str, ...], regions: tuple[str, ...], yes: bool
) -> None:
    """Build WORKFLOW's environment now, on a runner of the workspace, and
    store it ("remote build"): its next run, on that machine or (restored
    from storage) on any other of the same platform, installs nothing.

    The build is a run of WORKFLOW whose one job per environment runs no
    commands; it needs the same code as a run (the requirements file is
    read from the submitted commit and uncommitted changes).
    """
    placement = _placement(backends, regions, None, None)
    workspace = find_workspace(Path.cwd())
    sources = _workflow_sources(workspace.root)
    file = load_workflows(sources)
    variables = _variables(workspace.root, [wf.name for wf in run_workflows(file, workflow)])
    inherited = {n: os.environ[n] for n in inherited_env_names(file, workflow) if n in os.environ}
    plan = resolve_run_plan(file, workflow, env_overrides={}, inherited_env=inherited, variables=variables)
    if not any(job.environment for job in plan.jobs if job.workflow == workflow):
        raise CliError(
            f"workflow {workflow!r} has no environment: nothing to build."
            " Give it environment: (or requirements: with provider: python); docs/ENVIRONMENTS.md"
        )
    client = _client()
    guard = SizeGuard(
        warn_bytes=_warn_size(None),
        hard_bytes=client.server_info().get("max_blob_bytes"),
        ask=None if (yes or not sys.stdin.isatty()) else _confirm,
        warn=_warn_lines,
    )
    code = prepare_code(workspace, force_upload=upload, upload_blob=client.upload_blob, warn=_warn, check=guard)
    created = client.create_run(
        workflow=workflow,
        code=code,
        workflows_files=[{"path": s.path, "text": s.text} for s in sources],
        inherited_env=inherited,
        variables=variables,
        placement=placement,
        environment_files=environment_files_of_plan(workspace.root, plan),
        environment_build=True,
    )
    click.echo(f"Run {created['name']} builds the environment of {workflow}", err=True)
    if detach:
        click.echo(created["name"])
        return
    final = _follow(client, created["name"], seen={})
    # environment_lines: "  <job>  <key>" for each job that ran in one.
    keys = [line.split()[-1] for line in environment_lines(cast(dict[str, Any], client.get_run(created["name"])))]
    for key in dict.fromkeys(keys):
        found = client.get_environment(key)
        stored = "stored: other machines restore it" if found.get("stored") else "not stored: other machines build it"
        packages = found.get("packages", 0)
        click.echo(
            f"Environment {key}: built in {found.get('build_seconds', 0):.1f}s on {found.get('built_on') or '-'},"
            f" {size(found.get('size_bytes'))}, {packages} package{'s' * (packages != 1)}; {stored}",
            err=True,
        )
    sys.exit(run_exit_code(final))


@env.command("show")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print the API's environment object.")
def env_show(key: str, as_json: bool) -> None:
    """Show environment KEY: platform, build, the runs that used it, and what is installed."""
    found = _client().get_environment(key)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    platform = found.get("platform") or {}
    click.echo(f"Environment {found['key']}")
    click.echo(f"  platform: {', '.join(f'{k} {v}' for k, v in sorted(platform.items())) or '-'}")
    click.echo(
        f"  built in {found.get('build_seconds', 0):.1f}s on {found.get('built_on') or '-'},"
        f" {size(found.get('size_bytes'))}, {found.get('packages', 0)} packages"
    )
    runs = found.get("recent_runs") or []
    click.echo(f"  runs: {', '.join(runs) if runs else '-'}")
    stored = "yes: other machines restore it" if found.get("stored") else "no: other machines build it"
    click.echo(f"  stored in the workspace's storage: {stored}")
    installed = (found.get("installed") or "").strip()
    if installed:
        click.echo("\nInstalled:\n" + "\n".join(f"  {line}" for line in installed.splitlines()))
    click.echo(f"\nThe lock (exact versions and hashes): trainyard env lock {found['key']} > requirements.lock")


@env.command("lock")
@click.argument("key")
def env_lock(key: str) -> None:
    """Print environment KEY's lock (`uv pip sync` of it installs exactly its packages)."""
    lock = _client().get_environment(key).get("lock") or ""
    if not lock:
        raise CliError(f"environment {key} has no requirements: nothing is locked")
    click.echo(lock, nl=False)


# ---------------------------------------------------------------- secrets


@cli.group(cls=_Group)
def secrets() -> None:
    """Workspace secrets: set as env in every job, shown as ***** in logs."""


@secrets.command("set")
@click.argument("name")
def secrets_set(name: str) -> None:
    """Set secret NAME. The value is read from a hidden prompt on a terminal,
    else from stdin (one trailing newline removed): never from the command
    line, where it would stay in the shell's history."""
    _check_secret_name(name)
    value = _secret_value(name)
    _client().set_secret(name, value)
    click.echo(f"Secret {name} set; runs get it as ${name}", err=True)


@secrets.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the API's secret objects (names and dates, no values).")
def secrets_ls(as_json: bool) -> None:
    """List the workspace's secrets (names only; values are never shown)."""
    found = _client().list_secrets()
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo("No secrets yet: add one with `trainyard secrets set NAME`.", err=True)
        return
    print_table(
        ["SECRET", "CREATED", "UPDATED", "VALUE"],
        [[s["name"], age(s.get("created_at")), age(s.get("updated_at")), _secret_state(s)] for s in found],
        tty=sys.stdout.isatty(),
    )
    for s in found:
        if s.get("problem"):
            click.echo(f"warning: {s['problem']}", err=True)


def _secret_state(secret: Secret) -> str:
    return "ok" if secret.get("readable", True) else "UNREADABLE"


@secrets.command("rm")
@click.argument("name")
def secrets_rm(name: str) -> None:
    """Remove secret NAME."""
    _check_secret_name(name)
    _client().remove_secret(name)
    click.echo(f"Removed secret {name}", err=True)


# ---------------------------------------------------------------- tokens


@cli.group(cls=_Group)
def token() -> None:
    """Your personal API tokens (for the CLI, the SDK and scripts)."""


@token.command("create")
@click.option("--name", default="cli", show_default=True, help="A label to tell the token apart.")
@click.option("--expires-in", default="", help="It stops working after this long: 30d, 12h, 90m, 2w (default: never).")
def token_create(name: str, expires_in: str) -> None:
    """Make a new API token and print it (shown this once: store it now)."""
    made = _client().create_token(name, expires_in=expires_in)
    click.echo(made["token"])
    until = f"expires {made['expires_at']}" if made.get("expires_at") else "never expires"
    click.echo(f"Token {made['prefix']}… ({made['name']}) {until}; it is not shown again.", err=True)


@token.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the API's token objects (never the tokens).")
def token_ls(as_json: bool) -> None:
    """List your API tokens that are not revoked."""
    found = _client().list_tokens()
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    rows = [
        [t["id"], t["name"], f"{t['prefix']}…", age(t.get("created_at")), age(t.get("last_used_at")),
         t.get("expires_at") or "never"]
        for t in found
    ]  # fmt: skip
    print_table(["ID", "NAME", "TOKEN", "CREATED", "USED", "EXPIRES"], rows, tty=sys.stdout.isatty())


@token.command("rm")
@click.argument("token_id")
def token_rm(token_id: str) -> None:
    """Revoke the token TOKEN_ID (its ID from `trainyard token ls`)."""
    _client().revoke_token(token_id)
    click.echo(f"Revoked token {token_id}", err=True)


# ---------------------------------------------------------------- repo


@cli.group(cls=_Group)
def repo() -> None:
    """The repository runs come from."""


@repo.group("credential", cls=_Group)
def repo_credential() -> None:
    """How runners clone a private repository (never shown back)."""


@repo_credential.command("set")
@click.option("--url", default=None, help="The repository's clone URL (default: this repo's origin remote).")
@click.option(
    "--https-token",
    "https_token",
    is_flag=True,
    help="Set a token for an HTTPS remote (read from a hidden prompt or stdin).",
)
@click.option("--username", default="", help="The username sent with the token (default: x-access-token).")
@click.option(
    "--ssh-key-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Set a private deploy key for an SSH remote.",
)
def repo_credential_set(url: str | None, https_token: bool, username: str, ssh_key_file: Path | None) -> None:
    """Set the credential runners clone the repository with. A token is read
    from a hidden prompt on a terminal, else from stdin: never from the
    command line, where it would stay in the shell's history."""
    if https_token == (ssh_key_file is not None):
        raise click.UsageError("give one of --https-token or --ssh-key-file")
    target = url or _this_remote()
    if ssh_key_file is not None:
        found = _client().set_repo_credential(target, kind="ssh-key", secret=_read_text(ssh_key_file))
    else:
        token = _token_value()
        found = _client().set_repo_credential(target, kind="https-token", secret=token, username=username)
    click.echo(f"Credential ({found['kind']}) set for {target}; runners clone it with it", err=True)


@repo_credential.command("rm")
@click.option("--url", default=None, help="The repository's clone URL (default: this repo's origin remote).")
def repo_credential_rm(url: str | None) -> None:
    """Remove the repository's credential."""
    target = url or _this_remote()
    _client().remove_repo_credential(target)
    click.echo(f"Removed the credential of {target}", err=True)


def _this_remote() -> str:
    workspace = find_workspace(Path.cwd())
    if not workspace.is_git:
        raise CliError("this directory is not in a git repository: name the repository with --url")
    try:
        found = remote_url(workspace.root)
    except CodeError as e:
        raise CliError(f"{e}; or name the repository with --url") from None
    if not found:
        raise CliError("this directory's repository has no remote: name the repository with --url")
    return found


# ---------------------------------------------------------------- backends, offers, instances


@cli.group(cls=_Group)
def backend() -> None:
    """Cloud accounts the workspace runs machines in (README "Connecting AWS")."""


@backend.group("add", cls=_Group)
def backend_add() -> None:
    """Connect a cloud account; the server checks it for real before saving it."""


@backend_add.command("aws")
@click.option("--name", default="aws", show_default=True, help="The backend's name in this workspace.")
@click.option("--role-arn", default=None, help="The IAM role Trainyard assumes (recommended; see `backend setup aws`).")
@click.option("--access-key-id", default=None, help="An IAM user's access key id (instead of a role).")
@click.option(
    "--secret-access-key",
    default=None,
    help="Its secret; else $AWS_SECRET_ACCESS_KEY, else a hidden prompt (or stdin when piped).",
)
@click.option("--regions", required=True, help="Comma-separated regions, e.g. us-east-1,eu-west-1.")
@click.option("--bucket", required=True, help="The S3 bucket for artifacts and checkpoints.")
@click.option("--subnet", "subnets", multiple=True, metavar="REGION=SUBNET", help="Use this subnet (repeatable).")
@click.option("--ami", "amis", multiple=True, metavar="REGION=AMI", help="The image for CPU machines (repeatable).")
@click.option("--gpu-ami", "gpu_amis", multiple=True, metavar="REGION=AMI", help="The image for GPU machines.")
def backend_add_aws(
    name: str,
    role_arn: str | None,
    access_key_id: str | None,
    secret_access_key: str | None,
    regions: str,
    bucket: str,
    subnets: tuple[str, ...],
    amis: tuple[str, ...],
    gpu_amis: tuple[str, ...],
) -> None:
    """Connect an AWS account with a role (the server assumes it with your
    workspace's external id) or with an IAM user's access keys."""
    if role_arn and access_key_id:
        raise click.UsageError("give either --role-arn or --access-key-id, not both")
    if not role_arn and not access_key_id:
        raise click.UsageError("give --role-arn (recommended) or --access-key-id and its secret")
    client = _client()
    body: dict[str, Any] = {"kind": "aws", "name": name, "regions": _split(regions), "bucket": bucket}
    body.update(_placement_options(subnets, amis, gpu_amis))
    setup = None
    if role_arn:
        setup = client.aws_setup(bucket=bucket)
        _show_setup(setup, role_arn=role_arn)
        body["role_arn"] = role_arn
    else:
        body["access_key_id"] = access_key_id
        body["secret_access_key"] = secret_access_key or _aws_secret()
    click.echo(f"Checking the account in {', '.join(body['regions'])} …", err=True)
    try:
        added = client.add_backend(body)
    except ApiError as e:
        if setup is not None and "could not assume role" in e.message:
            raise CliError(
                e.message,
                [
                    f"The role's trust policy must allow {setup['principal'] or 'the server'} to sts:AssumeRole "
                    f"with sts:ExternalId = {setup['external_id']} (shown above); fix it, then run this again."
                ],
            ) from None
        raise
    account = f" (AWS account {added['aws_account_id']})" if added.get("aws_account_id") else ""
    click.echo(f"Connected backend {added['name']}{account}: {added['status']}", err=True)


@backend.command("setup")
@click.argument("kind", type=click.Choice(["aws"]))
@click.option("--bucket", default="", help="Fill the bucket into the permission policy.")
@click.option("--json", "as_json", is_flag=True, help="Print the server's answer as JSON.")
def backend_setup(kind: str, bucket: str, as_json: bool) -> None:
    """Show your workspace's external id and the policies its AWS role needs
    (deploy/aws/role.yaml creates the role with them)."""
    setup = _client().aws_setup(bucket=bucket)
    if as_json:
        click.echo(json.dumps(setup, indent=2))
        return
    _show_setup(setup, role_arn="")


@backend.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print the API's backend objects (never credentials).")
def backend_ls(as_json: bool) -> None:
    """List the workspace's backends, their health and last error."""
    found = _client().list_backends()
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo("No backends yet: connect one with `trainyard backend add aws …`.", err=True)
        return
    rows = [
        [
            b["name"],
            b["kind"],
            b["status"],
            b.get("auth") or "-",
            ",".join(b.get("regions") or []) or "-",
            b.get("bucket") or "-",
            str(b.get("live_instances", 0)),
            age(b.get("validated_at")),
            truncate(b.get("status_reason") or ""),
        ]
        for b in found
    ]
    headers = ["NAME", "KIND", "STATUS", "AUTH", "REGIONS", "BUCKET", "LIVE", "VALIDATED", "REASON"]
    print_table(headers, rows, tty=sys.stdout.isatty())


@backend.command("validate")
@click.argument("name")
def backend_validate(name: str) -> None:
    """Check backend NAME again; a broken one becomes active when every check passes."""
    checked = _client().validate_backend(name)
    click.echo(f"Backend {checked['name']}: {checked['status']}", err=True)


@backend.command("rm")
@click.argument("name")
def backend_rm(name: str) -> None:
    """Remove backend NAME (refused while it has live instances)."""
    _client().remove_backend(name)
    click.echo(f"Removed backend {name}", err=True)


@cli.command()
@click.option("--gpu", default="", help="A GPU name, with an optional count: A10G or A10G:2.")
@click.option("--memory", default="", help="At least this much memory, e.g. 16GB.")
@click.option("--cpu", default="", help="At least this many CPUs.")
@click.option("--spot/--on-demand", "spot", default=None, help="Only spot, or only on-demand offers (default both).")
@click.option("--region", default="", help="Comma-separated regions.")
@click.option("--backend", "backend_kind", default="", help="Only this backend kind (aws, local, …).")
@click.option("-n", "limit", type=click.IntRange(min=1), default=20, show_default=True, help="At most N offers.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer.")
def offers(
    gpu: str, memory: str, cpu: str, spot: bool | None, region: str, backend_kind: str, limit: int, as_json: bool
) -> None:
    """Machines the workspace's backends offer for these needs, cheapest first."""
    policy = "auto" if spot is None else ("spot" if spot else "on-demand")
    found = _client().offers(gpu=gpu, memory=memory, cpu=cpu, spot_policy=policy, region=region, backend=backend_kind)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found["offers"]:
        why = f": {found['shortfall']}" if found.get("shortfall") else ""
        click.echo(f"No offer fits (from {found['accounts']} backend(s)){why}", err=True)
        return
    rows = [
        [
            o["region"],
            o.get("zone") or "-",
            o["instance_type"],
            "spot" if o["spot"] else "on-demand",
            f"${o['price_per_hour']:.4f}",
            str(o["cpus"]),
            size(o["memory_bytes"]),
            _gpus(o.get("gpus") or []),
        ]
        for o in found["offers"][:limit]
    ]
    print_table(
        ["REGION", "ZONE", "TYPE", "MARKET", "PRICE/H", "CPUS", "MEMORY", "GPUS"], rows, tty=sys.stdout.isatty()
    )
    dates = sorted({o["catalog_date"] for o in found["offers"] if o.get("catalog_date")})
    if dates:
        click.echo(f"Prices from the catalog of {', '.join(dates)}", err=True)


@cli.command()
@click.option("-a", "--all", "show_all", is_flag=True, help="Also the terminated and lost ones.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's instance objects.")
def instances(show_all: bool, as_json: bool) -> None:
    """The workspace's machines: type, region, market, price, state, uptime, job."""
    found = _client().list_instances(all_=show_all)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo("No instances running.", err=True)
        return
    rows = [
        [
            i["name"],
            i.get("backend") or "-",
            i.get("instance_type") or "-",
            i.get("region") or "-",
            "spot" if i.get("spot") else "on-demand",
            f"${float(i.get('price_per_hour') or 0):.4f}",
            i["status"],
            i.get("cloud_state") or "-",
            duration(i.get("uptime_seconds")),
            _current_job(i.get("current_job")),
        ]
        for i in found
    ]
    headers = ["NAME", "BACKEND", "TYPE", "REGION", "MARKET", "PRICE/H", "STATUS", "CLOUD", "UPTIME", "JOB"]
    print_table(headers, rows, tty=sys.stdout.isatty())


# ---------------------------------------------------------------- login


@cli.command()
@click.option("--url", default=None, help="The Trainyard server (default: TRAINYARD_URL or http://127.0.0.1:8000).")
@click.option("--token", prompt="API token", hide_input=True, help="A personal API token (trainyard_…).")
@click.option("--workspace", default=None, help="Workspace slug to use by default (else the server's default).")
def login(url: str | None, token: str, workspace: str | None) -> None:
    """Check a token against the server and save it for later commands."""
    url = (url or os.environ.get("TRAINYARD_URL") or DEFAULT_URL).rstrip("/")
    with Client(url, token, workspace) as client:
        me = client.me()
        chosen = workspace or me["default_workspace"]
    path = save_config(url=url, token=token, workspace=workspace)
    click.echo(f"Logged in to {url} as {me['username']} (workspace {chosen}); saved to {path}", err=True)
    if os.environ.get("TRAINYARD_TOKEN"):
        _warn("TRAINYARD_TOKEN is set in this environment and wins over the saved token")


# ---------------------------------------------------------------- helpers


def _client() -> Client:
    config = load_config()
    return Client(config.url, config.require_token(), config.workspace)


def _follow(
    client: Client,
    run_name: str,
    *,
    seen: dict[str, int],
    on_reused: Callable[[Job], None] = lambda job: None,
    announced: set[str] | None = None,
) -> Run:
    """Follow a run to its end; Ctrl-C detaches with exit code 130."""
    display = StatusDisplay(live=sys.stdout.isatty() and sys.stderr.isatty())
    follower = Follower(
        client,
        run_name,
        writer=LogWriter(),
        on_run=display.update,
        before_logs=display.pause,
        seen=seen,
        on_reused=on_reused,
        announced=announced,
    )
    try:
        return follower.follow()
    except KeyboardInterrupt:
        display.pause()
        _detach(run_name)
    finally:
        display.pause()


def _note_reused(job: Job) -> None:
    """``trainyard run``: a job reused from the cache, as it is decided."""
    cache = job["cached_from"]
    assert cache is not None
    click.echo(f"{job['name']}: {reused_words(cache['run'])}", err=True)


def _reused_summary(client: Client, run: Run) -> None:
    """After a run of which jobs were reused: their artifacts, which stay in
    the runs that made them, and how to get them."""
    sources = list(dict.fromkeys(c["run"] for j in run["jobs"] if (c := j.get("cached_from"))))
    if not sources:
        return
    every = all(j.get("cached_from") for j in run["jobs"])
    lines = reused_artifact_lines(run, {source: client.list_artifacts(source) for source in sources})
    head = "Every job was reused from the cache:" if every else "Reused from the cache:"
    downloads = [f"Artifacts: trainyard artifacts download {source} -o DIR" for source in sources]
    click.echo("\n".join([head, *lines, *downloads, f"Their logs: trainyard logs {run['name']}"]), err=True)


def _detach(run_name: str) -> NoReturn:
    click.echo(f"\ndetached; the run continues — trainyard stop {run_name} to stop it", err=True)
    sys.exit(130)


def _download_artifact(client: Client, artifact: Artifact, root: Path) -> Iterator[tuple[Path, int]]:
    for entry in artifact["files"]:
        dest = _safe_destination(root, artifact["path"], entry["path"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".trainyard-part")
        with partial.open("wb") as out:
            written, digest = client.download_artifact_file(artifact["id"], entry["path"], out)
        if written != entry["size"] or digest != entry["sha256"]:
            partial.unlink()
            raise CliError(
                f"{artifact['path']}/{entry['path']}: downloaded {written} bytes with sha256 "
                f"{digest}, but the manifest says {entry['size']} bytes with sha256 {entry['sha256']}"
            )
        os.replace(partial, dest)
        yield dest, written


def _safe_destination(root: Path, artifact_path: str, file_path: str) -> Path:
    """root/<artifact path>/<file path>, refusing anything that leaves root."""
    parts = [*PurePosixPath(artifact_path).parts, *PurePosixPath(file_path).parts]
    bad = (
        any(p in ("..", "") or p.startswith("/") for p in parts)
        or PurePosixPath(artifact_path).is_absolute()
        or PurePosixPath(file_path).is_absolute()
    )
    dest = root.joinpath(*[p for p in parts if p != "."]).resolve()
    if bad or not dest.is_relative_to(root) or dest == root:
        raise CliError(f"refusing artifact file {artifact_path}/{file_path}: its path leaves the output directory")
    return dest


def _display_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _shown_reason(run: Run) -> str:
    if run["status"] not in ("pending", "failed"):
        return ""
    return run.get("status_reason") or next((j["status_reason"] for j in run["jobs"] if j.get("status_reason")), "")


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _ENV_NAME.fullmatch(key):
            raise click.BadParameter(
                f"expected KEY=VALUE with KEY a variable name, got {pair!r}", param_hint="-e/--env"
            )
        env[key] = value
    return env


def _check_secret_name(name: str) -> None:
    if not _ENV_NAME.fullmatch(name):
        raise click.BadParameter(
            "a secret name is an environment variable name (letters, "
            f"digits and _, not starting with a digit), got {name!r}",
            param_hint="NAME",
        )


def _secret_value(name: str) -> str:
    if sys.stdin.isatty():
        value = click.prompt(f"Value of {name}", hide_input=True, default="", show_default=False)
    else:
        value = sys.stdin.read().removesuffix("\n").removesuffix("\r")
    if not value:
        raise CliError(
            "empty value: nothing was set (type the value at the prompt, or "
            f'pipe it: printf %s "$VALUE" | trainyard secrets set {name})'
        )
    return value


def _token_value() -> str:
    if sys.stdin.isatty():
        value = click.prompt("Token", hide_input=True, default="", show_default=False)
    else:
        value = sys.stdin.read().strip()
    if not value:
        raise CliError(
            "empty token: nothing was set (type it at the prompt, or pipe it: "
            'printf %s "$TOKEN" | trainyard repo credential set --https-token)'
        )
    return value


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"cannot read {path}: {e}") from None


def _format_server_error(err: dict[str, Any]) -> str:
    line = f":{err['line']}" if err.get("line") else ""
    return f"{err.get('file', '?')}{line}: {err.get('key', '?')}: {err.get('message', '')}"


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        region, sep, item = value.partition("=")
        if not sep or not region or not item:
            raise click.BadParameter(f"expected REGION=ID, got {value!r}", param_hint=option)
        pairs[region.strip()] = item.strip()
    return pairs


def _placement_options(subnets: tuple[str, ...], amis: tuple[str, ...], gpu_amis: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by_region: dict[str, list[str]] = {}
    for value in subnets:
        for region, subnet in _pairs((value,), "--subnet").items():
            by_region.setdefault(region, []).append(subnet)
    if by_region:
        out["subnets"] = by_region
    if amis:
        out["amis"] = _pairs(amis, "--ami")
    if gpu_amis:
        out["gpu_amis"] = _pairs(gpu_amis, "--gpu-ami")
    return out


def _aws_secret() -> str:
    """The secret access key: $AWS_SECRET_ACCESS_KEY, a hidden prompt, or stdin."""
    value = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    if not value and sys.stdin.isatty():
        value = click.prompt("AWS secret access key", hide_input=True, default="", show_default=False)
    elif not value:
        value = sys.stdin.read().strip()
    if not value:
        raise CliError(
            "no secret access key: pass --secret-access-key, set AWS_SECRET_ACCESS_KEY, or type it at the prompt"
        )
    return value


def _show_setup(setup: Any, *, role_arn: str) -> None:
    principal = setup["principal"] or "(not configured on the server: TRAINYARD_AWS_PRINCIPAL_ARN)"
    lines = [
        f"External id of this workspace: {setup['external_id']}",
        f"Trainyard's AWS principal: {principal}",
        f"The role{' ' + role_arn if role_arn else ''} must trust it with that external id (trust policy):",
        json.dumps(setup["trust_policy"], indent=2),
        "and carry this permission policy (or create both with deploy/aws/role.yaml):",
        json.dumps(setup["permission_policy"], indent=2),
    ]
    click.echo("\n".join(lines), err=True)


def _gpus(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return "-"
    names: dict[str, int] = {}
    for gpu in gpus:
        names[gpu["name"]] = names.get(gpu["name"], 0) + 1
    return ", ".join(f"{n}× {name}" for name, n in names.items())


def _current_job(job: dict[str, Any] | None) -> str:
    return f"{job['run']}/{job['job_name']}" if job else "-"


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def _warn_lines(message: str, details: list[str]) -> None:
    click.echo("\n".join([f"warning: {message}:", *details]), err=True)

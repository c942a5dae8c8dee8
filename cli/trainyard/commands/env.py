"""``trainyard env``: the environments the workspace's runners built, and
building one ahead of a run (``env build``, a run submitted by
``submission``'s sequence)."""

from __future__ import annotations

import click

from ..api import Client, Environment, Run
from ..output import age, environment_lines, size
from . import common, completers, options, submission


@click.group(cls=common.Group)
def env() -> None:
    """The environments the workspace's runners built (docs/ENVIRONMENTS.md)."""


@env.command("ls")
@options.json_option("Print the API's environment objects.")
def env_ls(as_json: bool) -> None:
    """List the workspace's environments, last used first."""
    common.print_list(
        common.client().list_environments(),
        lambda e: [
            e["key"],
            size(e.get("size_bytes")),
            str(e.get("packages", 0)),
            f"{e.get('build_seconds', 0):.1f}s",
            e.get("built_on") or "-",
            str(e.get("runs", 0)),
            "yes" if e.get("stored") else "no",
            age(e.get("last_used_at")),
        ],
        as_json=as_json,
        headers=["KEY", "SIZE", "PACKAGES", "BUILD", "BUILT ON", "RUNS", "STORED", "LAST USED"],
        empty="No environments yet: a workflow with requirements or environment: builds one.",
    )


@env.command("build")
@click.argument("workflow", shell_complete=completers.local_workflows)
@options.detach_option
@options.upload_option
@options.backend_option(overrides=True)
@options.region_option(overrides=True)
@options.yes_option
def env_build(workflow: str, detach: bool, upload: bool, backends: list[str], regions: list[str], yes: bool) -> None:
    """Build WORKFLOW's environment now, on a runner of the workspace, and
    store it ("remote build"): its next run, on that machine or (restored
    from storage) on any other of the same platform, installs nothing.

    The build is a run of WORKFLOW whose one job per environment runs no
    commands; it needs the same code as a run (the requirements file is
    read from the submitted commit and uncommitted changes).
    """
    placement = options.placement(backends, regions)
    local = submission.plan_locally(submission.RunRequest(workflow, placement=placement, environment_build=True))
    if not any(job.environment for job in local.plan.jobs if job.workflow == workflow):
        raise common.CliError(
            f"workflow {workflow!r} has no environment: nothing to build."
            " Give it environment: (or requirements: with provider: python); docs/ENVIRONMENTS.md"
        )
    api = common.client()
    created = submission.submit(api, local, upload=upload, warn_bytes=submission.warn_size(None), yes=yes)
    assert created is not None  # not a dry run
    announcement = f"Run {created['name']} builds the environment of {workflow}"
    submission.follow_submitted(api, created, announcement, detach=detach, report=_report_built)


@env.command("show")
@click.argument("key", shell_complete=completers.named("environment"))
@options.json_option("Print the API's environment object.")
def env_show(key: str, as_json: bool) -> None:
    """Show environment KEY: platform, build, the runs that used it, and what is installed."""
    found = common.client().get_environment(key)
    if as_json:
        common.print_json(found)
        return
    platform = found.get("platform") or {}
    click.echo(f"Environment {found['key']}")
    click.echo(f"  platform: {', '.join(f'{k} {v}' for k, v in sorted(platform.items())) or '-'}")
    click.echo(f"  {_built(found)}")
    runs = found.get("recent_runs") or []
    click.echo(f"  runs: {', '.join(runs) if runs else '-'}")
    stored = "yes: other machines restore it" if found.get("stored") else "no: other machines build it"
    click.echo(f"  stored in the workspace's storage: {stored}")
    installed = (found.get("installed") or "").strip()
    if installed:
        click.echo("\nInstalled:\n" + "\n".join(f"  {line}" for line in installed.splitlines()))
    click.echo(f"\nThe lock (exact versions and hashes): trainyard env lock {found['key']} > requirements.lock")


@env.command("lock")
@click.argument("key", shell_complete=completers.named("environment"))
def env_lock(key: str) -> None:
    """Print environment KEY's lock (`uv pip sync` of it installs exactly its packages)."""
    lock = common.client().get_environment(key).get("lock") or ""
    if not lock:
        raise common.CliError(f"environment {key} has no requirements: nothing is locked")
    click.echo(lock, nl=False)


def _built(found: Environment) -> str:
    """How an environment was built: "built in 2.2s on local-…, 6.1 MiB, 6 packages"."""
    packages = found.get("packages", 0)
    return (
        f"built in {found.get('build_seconds', 0):.1f}s on {found.get('built_on') or '-'},"
        f" {size(found.get('size_bytes'))}, {packages} package{'s' * (packages != 1)}"
    )


def _report_built(api: Client, run: Run) -> None:
    """After a build: each environment it built, how, and whether it is stored."""
    # environment_lines: "  <job>  <key>" for each job that ran in one.
    keys = [line.split()[-1] for line in environment_lines(api.get_run(run["name"]))]
    for key in dict.fromkeys(keys):
        found = api.get_environment(key)
        stored = "stored: other machines restore it" if found.get("stored") else "not stored: other machines build it"
        click.echo(f"Environment {key}: {_built(found)}; {stored}", err=True)

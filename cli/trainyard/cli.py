"""The ``trainyard`` command: the group that holds every command of
``trainyard.commands`` (one module each), and ``main``, which runs it
(the console script, ``trainyard.console``, starts ``ssh`` and ``ssh-proxy``
without loading the others).

Exit codes: 0 success; 1 an error (bad workflow file, server error, server
unreachable, missing token, a failed or stopped run without an exit code);
2 bad usage; ``trainyard run`` returns the exit code of the first job that
failed with one; 130 when following is interrupted with Ctrl-C (the run
continues). The CLI's own messages go to stderr; stdout carries the job's
stdout, tables, JSON, and the run name of ``run -d``.
"""

from __future__ import annotations

import os
import sys

import click

from . import __version__
from .commands import (
    artifacts,
    backend,
    budget,
    common,
    completion,
    cost,
    data,
    env,
    forward,
    guards,
    init,
    instances,
    login,
    logs,
    metrics,
    notify,
    offers,
    ps,
    repo,
    rerun,
    run,
    runners,
    secrets,
    show,
    ssh,
    ssh_config,
    ssh_key,
    ssh_proxy,
    stop,
    tag,
    token,
    volume,
    workflows,
    workspace,
)

COMMANDS: list[click.Command] = [
    artifacts.artifacts,
    backend.backend,
    budget.budget,
    completion.completion,
    cost.cost,
    data.data,
    env.env,
    forward.forward,
    guards.guards,
    init.init,
    instances.instances,
    login.login,
    logs.logs,
    metrics.metrics,
    notify.notify,
    offers.offers,
    ps.ps,
    repo.repo,
    rerun.rerun,
    run.run,
    runners.runners,
    secrets.secrets,
    show.show,
    ssh.ssh,
    ssh_config.ssh_config,
    ssh_key.ssh_key,
    ssh_proxy.ssh_proxy,
    stop.stop,
    tag.tag,
    token.token,
    volume.volume,
    workflows.workflows,
    workspace.workspace,
]


# Other names of commands, kept working (not listed in the help).
ALIASES = {"runner": "runners"}


@click.group(cls=common.Group, context_settings={"help_option_names": ["-h", "--help"]}, aliases=ALIASES)
@click.option(
    "-w",
    "--workspace",
    metavar="SLUG",
    default=None,
    help="The workspace every command acts in (TRAINYARD_WORKSPACE; else the profile's, else your default).",
)
@click.option(
    "--profile",
    metavar="NAME",
    default=None,
    help="The saved login to use (TRAINYARD_PROFILE; else 'default'): see `trainyard login --profile`.",
)
@click.version_option(__version__, prog_name="trainyard")
@click.pass_context
def cli(ctx: click.Context, workspace: str | None, profile: str | None) -> None:
    """Run ML training workflows on Trainyard.

    Configuration: `trainyard login` saves a profile (server and token);
    TRAINYARD_URL, TRAINYARD_TOKEN, TRAINYARD_WORKSPACE and TRAINYARD_PROFILE
    win over it.
    """
    _set_for_this_command(ctx, TRAINYARD_WORKSPACE=workspace, TRAINYARD_PROFILE=profile)


def _set_for_this_command(ctx: click.Context, **values: str | None) -> None:
    """The global options act as the variables they stand for, so every
    command reads them the one way (``trainyard.config``), and so do the
    processes a command starts (ssh's ProxyCommand); restored when the
    command ends."""
    for name, value in values.items():
        if value is None:
            continue
        before = os.environ.get(name)
        os.environ[name] = value
        ctx.call_on_close(lambda name=name, before=before: _restore(name, before))


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


for _command in COMMANDS:
    cli.add_command(_command)


def main() -> None:
    """Every command (the console script is ``trainyard.console.main``)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")  # a job's odd bytes must not crash the CLI
    cli(prog_name="trainyard")

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

import sys

import click

from . import __version__
from .commands import (
    artifacts,
    backend,
    budget,
    common,
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
)

COMMANDS: list[click.Command] = [
    artifacts.artifacts,
    backend.backend,
    budget.budget,
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
]


# Other names of commands, kept working (not listed in the help).
ALIASES = {"runner": "runners"}


@click.group(cls=common.Group, context_settings={"help_option_names": ["-h", "--help"]}, aliases=ALIASES)
@click.version_option(__version__, prog_name="trainyard")
def cli() -> None:
    """Run ML training workflows on Trainyard.

    Configuration: TRAINYARD_URL, TRAINYARD_TOKEN, TRAINYARD_WORKSPACE
    (or `trainyard login`).
    """


for _command in COMMANDS:
    cli.add_command(_command)


def main() -> None:
    """Every command (the console script is ``trainyard.console.main``)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")  # a job's odd bytes must not crash the CLI
    cli(prog_name="trainyard")

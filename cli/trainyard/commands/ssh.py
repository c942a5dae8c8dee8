"""``trainyard ssh``: a shell in a running job, or one command there, with
the stock OpenSSH client through the server (no port is opened on the
job's machine)."""

from __future__ import annotations

import click

from ..sshclient import exec_ssh, prepare, ssh_argv
from . import common


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("run")
@click.option("--job", default=None, help="The job of a run of several (default: its only running one).")
@click.option("--wait", is_flag=True, help="A job not running yet (pending, its machine starting): wait until it runs.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh(run: str, job: str | None, wait: bool, command: tuple[str, ...]) -> None:
    """Open a shell in a running job of RUN, or run COMMAND there
    (`trainyard ssh RUN -- CMD ARGS…`; the exit code is the command's).

    The job's working directory, environment and secrets are those of its
    commands. On first use, when none of your registered SSH keys is on this
    machine, Trainyard makes one (~/.config/trainyard/ssh/id_ed25519) and
    registers it. `trainyard ssh-config` makes `ssh`, `scp` and `rsync` work too.
    """
    target = prepare(common.client(), run, job, say=lambda line: click.echo(line, err=True), wait=wait)
    exec_ssh(ssh_argv(target, [], list(command)))

"""``trainyard forward``: local ports to a running job's ports, with the
stock ``ssh -N -L`` through the job's host entry."""

from __future__ import annotations

import re

import click

from ..api import Job
from ..sshclient import exec_ssh, pick_job, prepare, ssh_argv
from . import common, completers

SPEC = re.compile(r"^(?:(\d{1,5})|(PORT_\d{1,3}))(?::(?:(\d{1,5})|(PORT_\d{1,3})))?$")


@click.command()
@click.argument("run", shell_complete=completers.runs)
@click.argument("ports", nargs=-1, required=True)
@click.option("--job", default=None, help="The job of a run of several (default: its only running one).")
def forward(run: str, ports: tuple[str, ...], job: str | None) -> None:
    """Forward local ports to ports of a running job of RUN until Ctrl-C.

    Each PORT is LOCAL[:REMOTE]: `8888` (the same port), `8080:80`, or the
    job's picked port by name, `8888:PORT_0` or `PORT_0` (its number here too).
    Only this machine's loopback address listens.
    """
    api = common.client()
    job_out = pick_job(api.get_run(run), job)
    pairs = [_pair(spec, job_out) for spec in ports]
    target = prepare(api, run, job_out["name"], say=lambda line: click.echo(line, err=True))
    for local, remote in pairs:
        click.echo(f"http://127.0.0.1:{local} -> port {remote} of {target.alias}")
    click.echo("Forwarding until Ctrl-C.", err=True)
    options = ["-N", "-o", "ExitOnForwardFailure=yes"]
    for local, remote in pairs:
        options += ["-L", f"127.0.0.1:{local}:127.0.0.1:{remote}"]
    exec_ssh(ssh_argv(target, options, []))


def _pair(spec: str, job: Job) -> tuple[int, int]:
    match = SPEC.match(spec)
    if match is None:
        raise common.CliError(f"{spec!r} is not a port to forward: LOCAL[:REMOTE], e.g. 8888, 8080:80, 8888:PORT_0")
    local_number, local_name, remote_number, remote_name = match.groups()
    local = int(local_number) if local_number else _named(local_name, job)
    remote = int(remote_number) if remote_number else _named(remote_name, job) if remote_name else local
    for port in (local, remote):
        if not 1 <= port <= 65535:
            raise common.CliError(f"{spec!r}: a port is between 1 and 65535")
    return local, remote


def _named(name: str, job: Job) -> int:
    index = int(name.removeprefix("PORT_"))
    picked = job.get("ports") or []
    if index >= len(picked):
        raise common.CliError(f"job {job['name']} has no {name}: its ports are {picked or 'none'}")
    return int(picked[index])

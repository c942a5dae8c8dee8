"""``trainyard ssh-config``: ``Host`` entries for running jobs, so the stock
``ssh``, ``scp``, ``rsync`` and VS Code's Remote-SSH reach them by name
(``trainyard.sshconfig`` says what is written where)."""

from __future__ import annotations

import click

from ..sshclient import default_workspace, ensure_registered_key, entries_of, scope_of
from ..sshconfig import HostEntry, write_entries
from . import common


@click.command("ssh-config")
@click.argument("runs", nargs=-1)
def ssh_config(runs: tuple[str, ...]) -> None:
    """Write SSH host entries for the jobs of the running runs (or of RUNS)
    to ~/.config/trainyard/ssh/config, included from ~/.ssh/config; then
    `ssh trainyard-RUN`, `scp FILE trainyard-RUN:` and
    `code --remote ssh-remote+trainyard-RUN /path` work."""
    api = common.client()
    identity = ensure_registered_key(api, say=lambda line: click.echo(line, err=True))
    default = default_workspace(api)
    named = [api.get_run(name) for name in runs]
    found = named or list(api.iter_runs(status="running"))
    entries: list[HostEntry] = []
    for run in found:
        entries += entries_of(api, run, default=default)
    path = write_entries(entries, replace_scope=None if runs else scope_of(api), identity=identity)
    for entry in entries:
        click.echo(f"{entry.alias}\t{entry.run}" + (f" (job {entry.job})" if entry.job else ""))
    if not entries:
        common.warn("no running runs: no host entries written (name runs to write theirs)")
    click.echo(f"Wrote {len(entries)} host(s) to {path}; `ssh HOST` reaches a running job.", err=True)

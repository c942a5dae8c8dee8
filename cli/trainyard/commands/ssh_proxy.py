"""``trainyard ssh-proxy``: the ``ProxyCommand`` of the host entries
``trainyard ssh-config`` writes. It asks the server for a session into the
job, writes the job's host key where ssh checks it, and carries ssh's bytes
over the session's websocket (stdin and stdout).

ssh starts it for every connection (``trainyard.console`` loads only this
module for it), so it imports no more than it uses and says its own errors.
"""

from __future__ import annotations

from typing import Any

import click

from ..api import ApiError, Client
from ..config import ConfigError, config_for_url, load_config
from ..proxy import ProxyError, pump
from ..sshconfig import SshConfigError, write_host_key


class ProxyFailed(click.ClickException):
    """Shown as ``error: message`` (as every command's errors), exit code 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


@click.command("ssh-proxy")
@click.argument("run")
@click.option("--job", default=None, help="The job of a run of several.")
@click.option("--alias", required=True, help="The host name ssh was given (its known_hosts entry).")
@click.option("--url", default=None, help="The Trainyard server (default: the configured one).")
@click.option("--workspace", default=None, help="The run's workspace (default: the configured one).")
def ssh_proxy(run: str, job: str | None, alias: str, url: str | None, workspace: str | None) -> None:
    """Connect stdin and stdout to the SSH server of a running job of RUN
    (for ssh's ProxyCommand; not for people)."""
    try:
        config = config_for_url(url) if url else load_config()
        with Client(url or config.url, config.require_token(), workspace or config.workspace) as api:
            grant = api.create_session(run, kind="ssh", job=job)
        write_host_key(alias, str(grant.get("host_key") or ""))
        reason = pump(grant, read_fd=0, write_fd=1)  # ssh's ends of the ProxyCommand
    except ApiError as e:
        raise ProxyFailed(e.message) from None
    except (ConfigError, SshConfigError, ProxyError) as e:
        raise ProxyFailed(str(e)) from None
    if reason:
        click.echo(f"trainyard: the session ended: {reason}", err=True)

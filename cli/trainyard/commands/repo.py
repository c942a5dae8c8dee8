"""``trainyard repo``: the repository runs come from, and the credential
runners clone a private one with (set from a prompt, stdin or a key file;
never shown back)."""

from __future__ import annotations

from pathlib import Path

import click

from ..code import CodeError, find_workspace, remote_url
from . import common


@click.group(cls=common.Group)
def repo() -> None:
    """The repository runs come from."""


@repo.group("credential", cls=common.Group)
def repo_credential() -> None:
    """How runners clone a private repository (never shown back)."""


url_option = click.option(
    "--url", default=None, help="The repository's clone URL (default: this repo's origin remote)."
)


@repo_credential.command("set")
@url_option
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
        found = common.client().set_repo_credential(target, kind="ssh-key", secret=common.read_text(ssh_key_file))
    else:
        secret = common.read_hidden("Token")
        if not secret:
            raise common.CliError(
                "empty token: nothing was set (type it at the prompt, or pipe it: "
                'printf %s "$TOKEN" | trainyard repo credential set --https-token)'
            )
        found = common.client().set_repo_credential(target, kind="https-token", secret=secret, username=username)
    click.echo(f"Credential ({found['kind']}) set for {target}; runners clone it with it", err=True)


@repo_credential.command("rm")
@url_option
def repo_credential_rm(url: str | None) -> None:
    """Remove the repository's credential."""
    target = url or _this_remote()
    common.client().remove_repo_credential(target)
    click.echo(f"Removed the credential of {target}", err=True)


def _this_remote() -> str:
    workspace = find_workspace(Path.cwd())
    if not workspace.is_git:
        raise common.CliError("this directory is not in a git repository: name the repository with --url")
    try:
        found = remote_url(workspace.root)
    except CodeError as e:
        raise common.CliError(f"{e}; or name the repository with --url") from None
    if not found:
        raise common.CliError("this directory's repository has no remote: name the repository with --url")
    return found

"""``trainyard secrets``: the workspace's secrets. A value is read from a
hidden prompt or stdin, never from the command line, and never shown back."""

from __future__ import annotations

import click

from ..api import Secret
from ..output import age
from . import common, options


@click.group(cls=common.Group)
def secrets() -> None:
    """Workspace secrets: env of the jobs whose workflow names them
    (secrets: [NAME]), shown as ***** in logs. Admins set and remove them."""


@secrets.command("set")
@click.argument("name")
def secrets_set(name: str) -> None:
    """Set secret NAME. The value is read from a hidden prompt on a terminal,
    else from stdin (one trailing newline removed): never from the command
    line, where it would stay in the shell's history."""
    _check_secret_name(name)
    value = common.read_hidden(f"Value of {name}", exact=True)
    if not value:
        raise common.CliError(
            "empty value: nothing was set (type the value at the prompt, or "
            f'pipe it: printf %s "$VALUE" | trainyard secrets set {name})'
        )
    common.client().set_secret(name, value)
    click.echo(f"Secret {name} set; a job gets it as ${name} when its workflow names it (secrets: [{name}])", err=True)


@secrets.command("ls")
@options.json_option("Print the API's secret objects (names and dates, no values).")
def secrets_ls(as_json: bool) -> None:
    """List the workspace's secrets (names only; values are never shown)."""
    found = common.client().list_secrets()
    listed = common.print_list(
        found,
        lambda s: [s["name"], age(s.get("created_at")), age(s.get("updated_at")), _secret_state(s)],
        as_json=as_json,
        headers=["SECRET", "CREATED", "UPDATED", "VALUE"],
        empty="No secrets yet: add one with `trainyard secrets set NAME`.",
    )
    for s in found if listed else []:
        if s.get("problem"):
            common.warn(s["problem"])


@secrets.command("rm")
@click.argument("name")
def secrets_rm(name: str) -> None:
    """Remove secret NAME."""
    _check_secret_name(name)
    common.client().remove_secret(name)
    click.echo(f"Removed secret {name}", err=True)


def _secret_state(secret: Secret) -> str:
    return "ok" if secret.get("readable", True) else "UNREADABLE"


def _check_secret_name(name: str) -> None:
    if not common.ENV_NAME.fullmatch(name):
        raise click.BadParameter(
            "a secret name is an environment variable name (letters, "
            f"digits and _, not starting with a digit), got {name!r}",
            param_hint="NAME",
        )

"""``trainyard token``: the caller's personal API tokens; a new one is shown
once, on stdout, and never again."""

from __future__ import annotations

import click

from ..output import age
from . import common, options


@click.group(cls=common.Group)
def token() -> None:
    """Your personal API tokens (for the CLI, the SDK and scripts)."""


@token.command("create")
@click.option("--name", default="cli", show_default=True, help="A label to tell the token apart.")
@click.option(
    "--expires-in",
    default="",
    help="It stops working after this long: 30d, 12h, 90m, 2w, or never"
    " (default: the server's, 90 days unless configured).",
)
def token_create(name: str, expires_in: str) -> None:
    """Make a new API token and print it (shown this once: store it now)."""
    made = common.client().create_token(name, expires_in=expires_in)
    click.echo(made["token"])
    until = f"expires {made['expires_at']}" if made.get("expires_at") else "never expires"
    click.echo(f"Token {made['prefix']}… ({made['name']}) {until}; it is not shown again.", err=True)


@token.command("ls")
@options.json_option("Print the API's token objects (never the tokens).")
def token_ls(as_json: bool) -> None:
    """List your API tokens that are not revoked."""
    common.print_list(
        common.client().list_tokens(),
        lambda t: [
            t["id"],
            t["name"],
            f"{t['prefix']}…",
            age(t.get("created_at")),
            age(t.get("last_used_at")),
            t.get("expires_at") or "never",
        ],
        as_json=as_json,
        headers=["ID", "NAME", "TOKEN", "CREATED", "USED", "EXPIRES"],
        empty=None,  # the headers alone
    )


@token.command("rm")
@click.argument("token_id")
def token_rm(token_id: str) -> None:
    """Revoke the token TOKEN_ID (its ID from `trainyard token ls`)."""
    common.client().revoke_token(token_id)
    click.echo(f"Revoked token {token_id}", err=True)

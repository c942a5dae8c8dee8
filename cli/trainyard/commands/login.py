"""``trainyard login``: check a token against a server and save both for the
other commands (``trainyard.config``)."""

from __future__ import annotations

import os

import click

from ..api import Client
from ..config import DEFAULT_URL, save_config
from . import common


@click.command()
@click.option("--url", default=None, help="The Trainyard server (default: TRAINYARD_URL or http://127.0.0.1:8000).")
@click.option("--token", prompt="API token", hide_input=True, help="A personal API token (trainyard_…).")
@click.option("--workspace", default=None, help="Workspace slug to use by default (else the server's default).")
def login(url: str | None, token: str, workspace: str | None) -> None:
    """Check a token against the server and save it for later commands."""
    url = (url or os.environ.get("TRAINYARD_URL") or DEFAULT_URL).rstrip("/")
    with Client(url, token, workspace) as api:
        me = api.me()
        chosen = workspace or me["default_workspace"]
    path = save_config(url=url, token=token, workspace=workspace)
    click.echo(f"Logged in to {url} as {me['username']} (workspace {chosen}); saved to {path}", err=True)
    if os.environ.get("TRAINYARD_TOKEN"):
        common.warn("TRAINYARD_TOKEN is set in this environment and wins over the saved token")

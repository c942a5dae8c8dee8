"""``trainyard workspace ls/use``: the workspaces you belong to, and which one
the profile in use acts in (``trainyard.config``)."""

from __future__ import annotations

import os

import click

from ..config import load_config, save_profile
from . import common, options


@click.group()
def workspace() -> None:
    """The workspaces you belong to, and the one commands act in."""


@workspace.command("ls")
@options.json_option("Print the API's workspaces, each with `current`.")
def ls(as_json: bool) -> None:
    """List your workspaces; * marks the one commands act in."""
    with common.client() as api:
        me = api.me()
        current = load_config().workspace or me["default_workspace"]
    rows = me["workspaces"]
    if as_json:
        common.print_json([{**w, "current": w["slug"] == current} for w in rows])
        return
    common.print_list(
        rows,
        lambda w: ["*" if w["slug"] == current else "", w["slug"], w["name"], w["role"]],
        as_json=False,
        headers=["", "SLUG", "NAME", "ROLE"],
        empty="You belong to no workspace: create one on the dashboard, or ask to be added to one.",
    )


@workspace.command("use")
@click.argument("slug")
def use(slug: str) -> None:
    """Act in workspace SLUG from now on (saved in the profile in use)."""
    with common.client() as api:
        common.check_member(slug, api.me())
    config = load_config()
    path = save_profile(config.profile, {"workspace": slug}, replace=False)
    click.echo(f"Profile {config.profile!r} now acts in workspace {slug} (saved in {path})", err=True)
    if os.environ.get("TRAINYARD_WORKSPACE"):
        common.warn("TRAINYARD_WORKSPACE (or -w) is set for this command and wins over the saved workspace")

"""``trainyard login``: sign in through the browser (a device code), or check
a given token, and save the server and token as a named profile
(``trainyard.config``)."""

from __future__ import annotations

import os
import socket
import sys
import webbrowser

import click

from .. import device
from ..api import Client
from ..config import DEFAULT_URL, check_profile_name, profile_in_use, save_profile, saved_profiles
from . import common


@click.command()
@click.option(
    "--url",
    default=None,
    help="The Trainyard server (default: TRAINYARD_URL, the profile's, or http://127.0.0.1:8000).",
)
@click.option("--token", default=None, help="An API token (trainyard_…) to save instead of signing in in the browser.")
@click.option(
    "--profile", default=None, metavar="NAME", help="Save as this profile (default: TRAINYARD_PROFILE or 'default')."
)
@click.option("--workspace", default=None, help="Workspace slug the profile uses (else your default workspace).")
@click.option("--no-browser", is_flag=True, help="Only print the sign-in link; do not open a browser.")
def login(url: str | None, token: str | None, profile: str | None, workspace: str | None, no_browser: bool) -> None:
    """Sign in and save the server and a token as a profile.

    Without --token: shows a code and opens the dashboard's sign-in page,
    where you approve the code; the CLI then gets a token of limited life.
    """
    name = check_profile_name(profile) if profile else profile_in_use()
    saved = saved_profiles().get(name, {})
    url = (url or os.environ.get("TRAINYARD_URL") or saved.get("url") or DEFAULT_URL).rstrip("/")
    expires_at = None
    if token is None:
        issued = _sign_in_through_the_browser(url, open_browser=not no_browser)
        token, expires_at = issued.token, issued.expires_at
    with Client(url, token, workspace) as api:
        me = api.me()
    if workspace:
        common.check_member(workspace, me)
    path = save_profile(
        name, {"url": url, "token": token, "workspace": workspace, "expires_at": expires_at}, replace=True
    )
    chosen = workspace or me["default_workspace"]
    life = f", token valid until {expires_at}" if expires_at else ""
    click.echo(
        f"Logged in to {url} as {me['username']} (workspace {chosen}{life}); saved as profile {name!r} in {path}",
        err=True,
    )
    if name != profile_in_use():
        click.echo(f"Use it with `trainyard --profile {name} …` or TRAINYARD_PROFILE={name}.", err=True)
    if os.environ.get("TRAINYARD_TOKEN"):
        common.warn("TRAINYARD_TOKEN is set in this environment and wins over the saved token")


def _sign_in_through_the_browser(url: str, *, open_browser: bool) -> device.DeviceToken:
    code = device.start(url, client_name=f"trainyard CLI on {socket.gethostname()}")
    click.echo(
        f"To sign in, open {code.verification_uri} and enter the code {code.user_code}\n"
        f"(or open {code.verification_uri_complete})",
        err=True,
    )
    if open_browser and _has_a_browser() and webbrowser.open(code.verification_uri_complete):
        click.echo("Opened the sign-in page in your browser.", err=True)
    click.echo(f"Waiting for the code to be approved (it expires in {code.expires_in // 60} min)…", err=True)
    try:
        return device.wait_for_token(url, code)
    except KeyboardInterrupt:
        raise common.CliError("sign-in cancelled") from None


def _has_a_browser() -> bool:
    """A desktop's browser, or the one BROWSER names. Without a display (an
    ssh session) Python would start a text browser (w3m, lynx) in this very
    terminal, over the code the person has to read."""
    if os.environ.get("BROWSER") or sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))

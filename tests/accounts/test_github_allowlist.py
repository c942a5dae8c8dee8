"""Who may sign in with GitHub (TRAINYARD_GITHUB_ALLOW), and the server's
refusal to start GitHub sign-in on a host that anyone signing in could run
commands on, or with the built-in secret key."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client

from backend.accounts.models import User
from tests.support.github import GithubServer, GithubUser, sign_in_with_github

REPO_ROOT = Path(__file__).resolve().parents[2]
EMAILS = [{"email": "x@example.com", "verified": True, "primary": True}]
OCTO = GithubUser(id=101, login="Octo", emails=EMAILS)
MALLORY = GithubUser(id=666, login="mallory", emails=EMAILS, orgs=["evil-corp"])
ACME_DEV = GithubUser(id=202, login="dev42", emails=EMAILS, orgs=["Acme"])


def _outcome(client: Client, github: GithubServer, who: GithubUser) -> str:
    """ "signed in", or the auth_error message the browser is sent to."""
    github.next_user = who
    response = sign_in_with_github(client, github)
    assert response.status_code == 302
    error = parse_qs(urlsplit(response["Location"]).query).get("auth_error")
    return error[0] if error else "signed in"


NOT_ALLOWED = (
    "This GitHub account may not sign in to this server: ask its administrator to add it"
    " (or an organization you belong to) to TRAINYARD_GITHUB_ALLOW."
)


@pytest.mark.django_db
def test_only_listed_logins_sign_in_and_a_refused_one_gets_no_account(github: GithubServer, settings: Any) -> None:
    settings.TRAINYARD_GITHUB_ALLOW = ["octo", "org:acme"]

    refused = _outcome(Client(), github, MALLORY)
    allowed = _outcome(Client(), github, OCTO)

    assert refused == NOT_ALLOWED
    assert list(User.objects.values_list("github_login", flat=True)) == ["octo"]
    assert allowed == "signed in"
    [authorize, _] = github.requests_to("/login/oauth/authorize")
    assert authorize.query["scope"] == "user:email,read:org"  # private org memberships are visible


@pytest.mark.django_db
def test_an_active_member_of_a_listed_org_signs_in(github: GithubServer, settings: Any) -> None:
    settings.TRAINYARD_GITHUB_ALLOW = ["someone-else", "org:acme"]

    assert _outcome(Client(), github, ACME_DEV) == "signed in"
    assert _outcome(Client(), github, MALLORY) == NOT_ALLOWED
    asked = [r.path for r in github.requests if "/memberships/" in r.path]
    assert asked == ["/api/v3/user/memberships/orgs/acme"] * 2
    assert list(User.objects.values_list("github_login", flat=True)) == ["dev42"]


@pytest.mark.django_db
def test_without_an_allowlist_everyone_signs_in_and_no_org_is_asked_for(github: GithubServer) -> None:
    assert _outcome(Client(), github, MALLORY) == "signed in"
    assert [r.path for r in github.requests if "/memberships/" in r.path] == []
    assert github.requests_to("/login/oauth/authorize")[0].query["scope"] == "user:email"


# ------------------------------------------------------------------ at start


def _check(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "DJANGO_SECRET_KEY", "TRAINYARD_GITHUB", "TRAINYARD_LOCAL", "TRAINYARD_ENV"))
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO_ROOT,
        env={**clean, "GITHUB_CLIENT_ID": "Iv1.x", "GITHUB_CLIENT_SECRET": "s", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


KEY = secrets.token_urlsafe(32)


def test_github_sign_in_with_the_local_backend_on_and_no_allowlist_refuses_to_start() -> None:
    result = _check(DJANGO_SECRET_KEY=KEY)

    assert result.returncode != 0
    assert "Set TRAINYARD_GITHUB_ALLOW to who may sign in" in result.stderr
    assert "TRAINYARD_LOCAL_BACKEND=false" in result.stderr


def test_github_sign_in_with_the_built_in_secret_key_refuses_to_start() -> None:
    default = _check(TRAINYARD_GITHUB_ALLOW="octo")
    spelled_out = _check(
        TRAINYARD_GITHUB_ALLOW="octo", DJANGO_SECRET_KEY="trainyard-embedded-development-key-not-for-production"
    )

    for result in (default, spelled_out):
        assert result.returncode != 0
        assert "built-in development DJANGO_SECRET_KEY" in result.stderr


@pytest.mark.parametrize(
    "env",
    [{"TRAINYARD_GITHUB_ALLOW": "octo,org:acme"}, {"TRAINYARD_LOCAL_BACKEND": "false"}],
    ids=["allowlist", "no-local-backend"],
)
def test_github_sign_in_starts_with_an_allowlist_or_without_the_local_backend(env: dict[str, str]) -> None:
    result = _check(DJANGO_SECRET_KEY=KEY, **env)

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


def test_a_malformed_allowlist_entry_is_refused_at_start() -> None:
    result = _check(DJANGO_SECRET_KEY=KEY, TRAINYARD_GITHUB_ALLOW="octo,team:acme")

    assert result.returncode != 0
    assert "TRAINYARD_GITHUB_ALLOW: 'team:acme' is not a GitHub login or org:<organization>." in result.stderr

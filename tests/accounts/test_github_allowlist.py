"""Who may sign in with GitHub (TRAINYARD_GITHUB_ALLOW), and the server's
refusal to start GitHub sign-in on a host that anyone signing in could run
commands on, or with the built-in secret key."""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import sys
from datetime import timedelta
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
    assert (
        "TRAINYARD_GITHUB_ALLOW: 'team:acme' is not a GitHub login, org:<organization> or id:<GitHub user id>."
        in result.stderr
    )


# ------------------------------------------------------------------ re-checked


def _me(token: str) -> Any:
    from rest_framework.test import APIClient

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api.get("/api/v1/me/")


NOBODY_DUE = {"allowed": 0, "refused": 0, "unknown": 0}


@pytest.mark.django_db
def test_a_removed_org_members_token_and_session_stop_working_within_the_recheck_interval(
    github: GithubServer, settings: Any
) -> None:
    from backend.accounts.services.allowlist import github_allow_recheck
    from backend.accounts.services.tokens import api_token_create

    settings.TRAINYARD_GITHUB_ALLOW = ["org:acme"]
    settings.TRAINYARD_GITHUB_ALLOW_RECHECK_SECONDS = 600
    dev = GithubUser(id=202, login="dev42", emails=EMAILS, orgs=["Acme"])
    browser = Client()
    assert _outcome(browser, github, dev) == "signed in"
    user = User.objects.get(github_id=202)
    assert user.github_token is not None and b"gho_" not in bytes(user.github_token)  # kept encrypted
    token = api_token_create(user=user, name="ci")
    signed_in = user.allow_checked_at
    assert signed_in is not None

    # Half an interval on, the account is due: GitHub is asked with its sign-in's token; still a member.
    assert github_allow_recheck(now=signed_in + timedelta(seconds=300)) == {**NOBODY_DUE, "allowed": 1}
    assert (
        github.requests_to("/api/v3/user/memberships/orgs/acme")[-1].headers["Authorization"].startswith("token gho_")
    )
    dev.orgs.clear()  # taken out of the organization just after that check
    assert _me(token).status_code == 200 and browser.get("/api/v1/me/").status_code == 200
    assert github_allow_recheck(now=signed_in + timedelta(seconds=450)) == NOBODY_DUE  # not due yet

    # The next check is at most one interval after the removal.
    assert github_allow_recheck(now=signed_in + timedelta(seconds=600)) == {**NOBODY_DUE, "refused": 1}

    refused = _me(token)
    assert refused.status_code == 401
    assert "is no longer allowed on this server (TRAINYARD_GITHUB_ALLOW" in refused.json()["message"]
    assert browser.get("/api/v1/me/").status_code in (401, 403)
    # A pass runs every half interval (beat), so no account goes a whole interval unchecked.
    assert (
        settings.CELERY_BEAT_SCHEDULE["github-allow-recheck"]["task"] == "backend.accounts.tasks.github_allow_recheck"
    )

    # Back in the organization, a sign-in lets the account and its tokens in again.
    dev.orgs.append("acme")
    assert _outcome(Client(), github, dev) == "signed in"
    assert _me(token).status_code == 200


@pytest.mark.django_db
def test_a_revoked_github_token_refuses_and_github_failing_refuses_nobody(github: GithubServer, settings: Any) -> None:
    from backend.accounts.services.allowlist import github_allow_recheck

    settings.TRAINYARD_GITHUB_ALLOW = ["org:acme"]
    settings.TRAINYARD_GITHUB_ALLOW_RECHECK_SECONDS = 600
    dev = GithubUser(id=202, login="dev42", emails=EMAILS, orgs=["Acme"])
    assert _outcome(Client(), github, dev) == "signed in"
    later = User.objects.get(github_id=202).allow_checked_at + timedelta(seconds=300)

    github.api_failing = True
    assert github_allow_recheck(now=later) == {**NOBODY_DUE, "unknown": 1}
    assert User.objects.get(github_id=202).is_active

    github.api_failing = False
    github.revoke_tokens_of(dev)  # the person took back the app's access: nothing can be checked
    assert github_allow_recheck(now=later) == {**NOBODY_DUE, "refused": 1}
    assert not User.objects.get(github_id=202).is_active


@pytest.mark.django_db
def test_an_account_listed_by_login_or_id_is_rechecked_without_asking_github(
    github: GithubServer, settings: Any
) -> None:
    from backend.accounts.services.allowlist import github_allow_recheck

    settings.TRAINYARD_GITHUB_ALLOW = ["octo", "id:202", "org:acme"]
    assert _outcome(Client(), github, OCTO) == "signed in"
    assert _outcome(Client(), github, GithubUser(id=202, login="renamed", emails=EMAILS)) == "signed in"
    assert User.objects.get(github_id=101).github_token is None  # listed itself: no token kept
    later = User.objects.get(github_id=101).allow_checked_at + timedelta(seconds=3600)

    assert github_allow_recheck(now=later) == {**NOBODY_DUE, "allowed": 2}
    assert [r.path for r in github.requests if "/memberships/" in r.path] == []

    settings.TRAINYARD_GITHUB_ALLOW = ["id:202", "org:acme"]  # the operator takes octo off the list
    assert github_allow_recheck(now=later + timedelta(seconds=3600)) == {**NOBODY_DUE, "allowed": 1, "refused": 1}
    assert not User.objects.get(github_id=101).is_active
    assert User.objects.get(github_id=202).is_active


@pytest.mark.django_db
def test_an_allowlist_id_entry_lets_that_account_in_under_any_login_and_not_a_login_holder(
    github: GithubServer, settings: Any
) -> None:
    settings.TRAINYARD_GITHUB_ALLOW = ["id:101"]

    assert _outcome(Client(), github, GithubUser(id=101, login="octo-renamed", emails=EMAILS)) == "signed in"
    assert _outcome(Client(), github, GithubUser(id=7, login="octo", emails=EMAILS)) == NOT_ALLOWED


@pytest.mark.django_db
def test_rotating_the_secret_keys_re_encrypts_kept_github_tokens(settings: Any) -> None:
    from cryptography.fernet import Fernet
    from django.core.management import call_command

    from backend.vault import crypto

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.TRAINYARD = {**settings.TRAINYARD, "SECRET_KEYS": [old]}
    crypto._fernet.cache_clear()
    kept = User.objects.create(username="dev42", github_id=202, github_token=crypto.encrypt("gho_kept"))
    lost = User.objects.create(username="gone", github_id=203, github_token=b"gAAAAAtampered")
    try:
        settings.TRAINYARD = {**settings.TRAINYARD, "SECRET_KEYS": [new, old]}
        crypto._fernet.cache_clear()
        out = io.StringIO()
        call_command("rotate_secret_keys", stdout=out)
        assert "re-encrypted 1 kept GitHub sign-in token(s)" in out.getvalue()
        settings.TRAINYARD = {**settings.TRAINYARD, "SECRET_KEYS": [new]}
        crypto._fernet.cache_clear()

        assert crypto.decrypt(User.objects.get(pk=kept.pk).github_token) == "gho_kept"
        assert User.objects.get(pk=lost.pk).github_token is None  # the next re-check asks for a sign-in
    finally:
        crypto._fernet.cache_clear()

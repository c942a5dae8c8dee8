"""GitHub sign-in end to end: the Django app against a local GitHub over real HTTP."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from django.test import Client
from social_django.models import UserSocialAuth

from backend.accounts.models import Invitation, Membership, Role, User, Workspace
from backend.accounts.services import user_get_or_create
from tests.support.github import GithubServer, GithubUser, s256, sign_in_with_github

pytestmark = pytest.mark.django_db

PRIMARY = {"email": "octo@example.com", "verified": True, "primary": True}


def _octo(**changes: Any) -> GithubUser:
    fields: dict[str, Any] = {
        "id": 101,
        "login": "octo",
        "name": "Octo Cat",
        "email": "octo@example.com",
        "emails": [PRIMARY],
        "avatar_url": "https://avatars.example.test/u/101",
    }
    return GithubUser(**{**fields, **changes})


def _auth_error(response: Any) -> str:
    assert response.status_code == 302
    parts = urlsplit(response["Location"])
    assert parts.path == "/"
    return parse_qs(parts.query)["auth_error"][0]


def _signed_in_as(client: Client) -> str | None:
    response = client.get("/api/v1/me/")
    return response.json()["username"] if response.status_code == 200 else None


def test_first_sign_in_creates_the_user_with_a_personal_workspace(github: GithubServer) -> None:
    github.next_user = _octo()
    client = Client()

    response = sign_in_with_github(client, github)

    assert response.status_code == 302 and response["Location"] == "/"
    user = User.objects.get(github_id=101)
    assert (user.username, user.github_login, user.email) == ("octo", "octo", "octo@example.com")
    assert user.avatar_url == "https://avatars.example.test/u/101"
    assert not user.has_usable_password()
    workspace = Workspace.objects.get(personal_owner=user)
    assert workspace.slug == "octo"
    assert Membership.objects.get(workspace=workspace).role == Role.ADMIN
    assert UserSocialAuth.objects.get(provider="github").uid == "101"
    me = client.get("/api/v1/me/").json()
    assert me == {
        "username": "octo",
        "avatar_url": "https://avatars.example.test/u/101",
        "default_workspace": "octo",
        "workspaces": [{"slug": "octo", "name": "octo", "role": "admin"}],
    }


def test_sign_in_sends_state_and_an_s256_pkce_challenge_and_its_verifier(github: GithubServer) -> None:
    github.next_user = _octo()

    sign_in_with_github(Client(), github)

    [authorize] = github.requests_to("/login/oauth/authorize")
    [token] = github.requests_to("/login/oauth/access_token")
    assert authorize.query["code_challenge_method"] == "S256"
    assert len(authorize.query["state"]) >= 32
    assert authorize.query["scope"] == "user:email"
    assert s256(token.form["code_verifier"]) == authorize.query["code_challenge"]
    assert token.headers["Accept"] == "application/json"
    assert github.requests_to("/api/v3/user")[0].headers["Authorization"].startswith("token gho_")


def test_second_sign_in_is_the_same_user_and_follows_a_login_rename(github: GithubServer) -> None:
    github.next_user = _octo()
    sign_in_with_github(Client(), github)
    first = User.objects.get(github_id=101)
    github.next_user = _octo(login="octocat", avatar_url="https://avatars.example.test/u/101?v=2")
    client = Client()

    response = sign_in_with_github(client, github)

    assert response["Location"] == "/"
    user = User.objects.get(github_id=101)
    assert user.pk == first.pk
    assert (user.username, user.github_login, user.avatar_url) == (
        "octocat",
        "octocat",
        "https://avatars.example.test/u/101?v=2",
    )
    assert User.objects.count() == 1
    assert Workspace.objects.filter(personal_owner=user).count() == 1
    assert _signed_in_as(client) == "octocat"


def test_denied_authorisation_redirects_with_a_message_and_creates_no_user(github: GithubServer) -> None:
    github.mode = "deny"
    client = Client()

    response = sign_in_with_github(client, github)

    assert _auth_error(response) == "GitHub sign-in was cancelled."
    assert User.objects.count() == 0
    assert _signed_in_as(client) is None


def test_a_state_that_does_not_match_the_session_is_refused(github: GithubServer) -> None:
    github.next_user = _octo()
    client = Client()

    def other_state(callback: str) -> str:
        parts = urlsplit(callback)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        return f"{parts.path}?{urlencode({**query, 'state': 'x' * 32})}"

    response = sign_in_with_github(client, github, tamper=other_state)

    assert "sign in again" in _auth_error(response)
    assert User.objects.count() == 0
    assert github.requests_to("/login/oauth/access_token") == []


def test_a_callback_cannot_be_replayed(github: GithubServer) -> None:
    github.next_user = _octo()
    client = Client()
    callbacks: list[str] = []

    def keep(callback: str) -> str:
        callbacks.append(callback)
        return callback

    sign_in_with_github(client, github, tamper=keep)
    parts = urlsplit(callbacks[0])
    replay = Client().get(f"{parts.path}?{parts.query}")

    assert "sign in again" in _auth_error(replay)


def test_a_callback_opened_in_another_browser_is_refused(github: GithubServer) -> None:
    """Login CSRF: an attacker's own callback URL, opened by a victim, must not sign the victim in."""
    github.next_user = _octo()
    begin = Client().post("/auth/login/github/")
    callback = urlsplit(httpx.get(begin["Location"]).headers["location"])
    victim = Client()

    response = victim.get(f"{callback.path}?{callback.query}")

    assert "sign in again" in _auth_error(response)
    assert _signed_in_as(victim) is None
    assert User.objects.count() == 0


def test_a_wrong_pkce_verifier_is_refused_by_github_and_signs_nobody_in(github: GithubServer) -> None:
    github.next_user = _octo()
    client = Client()

    def forget_the_verifier(callback: str) -> str:
        session = client.session
        for key, value in session.items():
            if key.startswith("github_oauth2_state_"):
                session[key] = {**value, "code_verifier": "w" * 43}
        session.save()
        return callback

    response = sign_in_with_github(client, github, tamper=forget_the_verifier)

    assert _auth_error(response) == "GitHub did not accept the sign-in: please sign in again."
    assert User.objects.count() == 0
    [token] = github.requests_to("/login/oauth/access_token")
    assert token.form["code_verifier"] == "w" * 43


def test_the_stand_in_refuses_a_wrong_verifier(github: GithubServer) -> None:
    github.next_user = _octo()
    verifier = "v" * 43
    query = {
        "client_id": github.client_id,
        "redirect_uri": github.callback_url,
        "state": "s" * 32,
        "code_challenge": s256(verifier),
        "code_challenge_method": "S256",
    }
    callback = httpx.get(f"{github.url}/login/oauth/authorize?{urlencode(query)}").headers["location"]
    code = parse_qs(urlsplit(callback).query)["code"][0]
    form = {
        "client_id": github.client_id,
        "client_secret": github.client_secret,
        "code": code,
        "redirect_uri": github.callback_url,
    }
    headers = {"Accept": "application/json"}

    wrong = httpx.post(
        f"{github.url}/login/oauth/access_token", data={**form, "code_verifier": "x" * 43}, headers=headers
    )
    right = httpx.post(
        f"{github.url}/login/oauth/access_token", data={**form, "code_verifier": verifier}, headers=headers
    )

    assert wrong.json()["error"] == "invalid_grant"
    assert right.json()["token_type"] == "bearer"


def test_a_user_without_a_public_email_signs_in_with_only_verified_emails_kept(github: GithubServer) -> None:
    github.next_user = _octo(
        email=None,
        emails=[
            {"email": "Claimed@Example.com", "verified": False, "primary": True},
            {"email": "work@example.com", "verified": True, "primary": False},
        ],
    )

    response = sign_in_with_github(Client(), github)

    assert response["Location"] == "/"
    assert User.objects.get(github_id=101).email == "work@example.com"


def test_an_existing_local_user_with_the_same_email_and_name_is_not_linked(github: GithubServer) -> None:
    local = user_get_or_create(username="octo", email="octo@example.com")
    github.next_user = _octo()
    client = Client()

    sign_in_with_github(client, github)

    local.refresh_from_db()
    assert local.github_id is None
    newcomer = User.objects.get(github_id=101)
    assert newcomer.pk != local.pk
    assert newcomer.username == "octo-101"
    assert _signed_in_as(client) == "octo-101"
    assert not UserSocialAuth.objects.filter(user=local).exists()


def test_a_login_taken_over_from_a_stale_account_is_cleared_there(github: GithubServer) -> None:
    github.next_user = _octo()
    sign_in_with_github(Client(), github)  # 101 was "octo"; renames on GitHub, has not signed in since
    github.next_user = _octo(id=202, emails=[{"email": "new@example.com", "verified": True, "primary": True}])

    sign_in_with_github(Client(), github)

    assert User.objects.get(github_id=202).username == "octo-202"
    assert User.objects.get(github_id=101).github_login == ""
    assert User.objects.get(github_id=202).github_login == "octo"


def test_the_signed_in_local_admin_is_never_linked_to_github(github: GithubServer, settings: Any) -> None:
    settings.TRAINYARD_LOCAL_LOGIN = True
    admin = user_get_or_create(username="admin")
    admin.set_password("pw-admin-1")
    admin.save()
    client = Client()
    assert client.post("/api/v1/auth/login/", {"username": "admin", "password": "pw-admin-1"}).status_code == 200
    github.next_user = _octo()

    sign_in_with_github(client, github)

    admin.refresh_from_db()
    assert admin.github_id is None
    assert not UserSocialAuth.objects.filter(user=admin).exists()
    assert _signed_in_as(client) == "octo"


def test_an_invitation_by_login_is_accepted_at_sign_in(github: GithubServer, team: Workspace, owner: Any) -> None:
    Invitation.objects.create(workspace=team, github_login="octo", role=Role.VIEWER, invited_by=owner.user)
    github.next_user = _octo(login="Octo")

    sign_in_with_github(Client(), github)

    user = User.objects.get(github_id=101)
    assert Membership.objects.get(workspace=team, user=user).role == Role.VIEWER
    invitation = Invitation.objects.get()
    assert invitation.accepted_by == user and invitation.accepted_at is not None


def test_an_invitation_by_email_is_accepted_only_for_a_verified_email(
    github: GithubServer, team: Workspace, owner: Any
) -> None:
    other = Workspace.objects.create(slug="other", name="Other")
    Invitation.objects.create(workspace=team, email="work@example.com", role=Role.MEMBER)
    Invitation.objects.create(workspace=other, email="claimed@example.com", role=Role.ADMIN)
    github.next_user = _octo(
        email="claimed@example.com",
        emails=[
            {"email": "claimed@example.com", "verified": False, "primary": True},
            {"email": "Work@Example.com", "verified": True, "primary": False},
        ],
    )

    sign_in_with_github(Client(), github)

    user = User.objects.get(github_id=101)
    assert Membership.objects.get(workspace=team, user=user).role == Role.MEMBER
    assert not Membership.objects.filter(workspace=other, user=user).exists()
    assert Invitation.objects.get(workspace=other).accepted_at is None


def test_an_inactive_user_is_not_signed_in(github: GithubServer) -> None:
    github.next_user = _octo()
    sign_in_with_github(Client(), github)
    User.objects.filter(github_id=101).update(is_active=False)
    client = Client()

    response = sign_in_with_github(client, github)

    assert _auth_error(response) == "This account is disabled."
    assert _signed_in_as(client) is None


def test_sign_in_is_a_post_with_csrf(github: GithubServer) -> None:
    assert Client().get("/auth/login/github/").status_code == 405
    assert Client(enforce_csrf_checks=True).post("/auth/login/github/").status_code == 403
    assert github.requests == []


def test_social_auth_requires_post_and_the_dashboards_form_post_signs_in(github: GithubServer, settings: Any) -> None:
    """SOCIAL_AUTH_REQUIRE_POST is on: a GET starts nothing, while the dashboard's button
    (a form POST with the CSRF token from the ``csrftoken`` cookie) signs in end to end."""
    github.next_user = _octo()
    browser = Client(enforce_csrf_checks=True)
    browser.get("/api/v1/auth/config/")  # the dashboard's first call: it sets the cookie
    token = browser.cookies["csrftoken"].value

    by_link = browser.get("/auth/login/github/")
    begin = browser.post("/auth/login/github/", {"csrfmiddlewaretoken": token})
    authorize = httpx.get(begin["Location"], follow_redirects=False, timeout=10)
    callback = urlsplit(authorize.headers["location"])
    done = browser.get(f"{callback.path}?{callback.query}")

    assert settings.SOCIAL_AUTH_REQUIRE_POST is True
    assert by_link.status_code == 405
    assert begin.status_code == 302
    assert done.status_code == 302 and done["Location"] == "/"
    assert _signed_in_as(browser) == "octo"


def test_without_a_github_app_sign_in_says_so(settings: Any) -> None:
    settings.GITHUB_CLIENT_ID = settings.GITHUB_CLIENT_SECRET = ""

    response = Client().post("/auth/login/github/")

    assert _auth_error(response) == "GitHub sign-in is not configured correctly on this server."


def test_github_being_unreachable_is_a_message_not_an_error_page(github: GithubServer) -> None:
    github.next_user = _octo()
    client = Client()

    def github_goes_down(callback: str) -> str:
        github.close()
        return callback

    response = sign_in_with_github(client, github, tamper=github_goes_down)

    assert _auth_error(response) == "GitHub could not be reached: please try again later."
    assert User.objects.count() == 0

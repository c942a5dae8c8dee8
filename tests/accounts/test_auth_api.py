"""The web app's session: sign-in config, local login and logout, CSRF."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from backend.accounts.models import User
from backend.accounts.services import user_get_or_create
from tests.support.github import GithubServer

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery"


@pytest.fixture
def admin() -> User:
    user = user_get_or_create(username="admin")
    user.set_password(PASSWORD)
    user.save()
    return user


def test_config_without_a_github_app_offers_local_login_and_sets_the_csrf_cookie() -> None:
    client = APIClient()

    response = client.get("/api/v1/auth/config/")

    assert response.status_code == 200
    assert response.json() == {"github": False, "local_login": True}
    assert response.cookies["csrftoken"].value


def test_config_with_a_github_app_offers_github_only(github: GithubServer) -> None:
    response = APIClient().get("/api/v1/auth/config/", HTTP_AUTHORIZATION="Bearer not-a-token")

    assert response.json() == {"github": True, "local_login": False}


def test_local_login_returns_me_and_starts_a_session(admin: User) -> None:
    client = APIClient()

    response = client.post("/api/v1/auth/login/", {"username": "admin", "password": PASSWORD}, format="json")

    assert response.status_code == 200
    assert response.json() == {
        "username": "admin",
        "avatar_url": "",
        "default_workspace": "admin",
        "workspaces": [{"slug": "admin", "name": "admin", "role": "admin"}],
    }
    assert client.get("/api/v1/me/").json()["username"] == "admin"


def test_local_login_with_a_wrong_password_is_a_400_with_a_message(admin: User) -> None:
    client = APIClient()

    response = client.post("/api/v1/auth/login/", {"username": "admin", "password": "nope"}, format="json")

    assert response.status_code == 400
    assert response.json() == {"message": "Wrong username or password.", "extra": {}}
    assert client.get("/api/v1/me/").status_code == 401


def test_local_login_when_disabled_is_a_403_even_with_the_right_password(admin: User, settings: Any) -> None:
    settings.TRAINYARD_LOCAL_LOGIN = False
    client = APIClient()

    response = client.post("/api/v1/auth/login/", {"username": "admin", "password": PASSWORD}, format="json")

    assert response.status_code == 403
    assert response.json()["message"] == "local login is disabled"
    assert client.get("/api/v1/me/").status_code == 401


def test_disabling_local_login_ends_local_sessions(admin: User, settings: Any) -> None:
    client = APIClient()
    client.post("/api/v1/auth/login/", {"username": "admin", "password": PASSWORD}, format="json")
    settings.TRAINYARD_LOCAL_LOGIN = False

    assert client.get("/api/v1/me/").status_code == 401


def test_a_github_user_has_no_password_to_log_in_with() -> None:
    user = User.objects.create(username="octo", github_id=101)
    user.set_unusable_password()
    user.save()

    response = APIClient().post("/api/v1/auth/login/", {"username": "octo", "password": ""}, format="json")

    assert response.status_code == 400


def test_login_checks_csrf_so_no_other_site_can_sign_a_browser_in(admin: User) -> None:
    client = APIClient(enforce_csrf_checks=True)
    body = {"username": "admin", "password": PASSWORD}

    refused = client.post("/api/v1/auth/login/", body, format="json")
    token = client.get("/api/v1/auth/config/").cookies["csrftoken"].value
    accepted = client.post("/api/v1/auth/login/", body, format="json", HTTP_X_CSRFTOKEN=token)

    assert refused.status_code == 403
    assert refused.json()["message"].startswith("CSRF Failed")
    assert accepted.status_code == 200


def test_logout_ends_the_session_and_needs_csrf(admin: User) -> None:
    client = APIClient(enforce_csrf_checks=True)
    token = client.get("/api/v1/auth/config/").cookies["csrftoken"].value
    client.post(
        "/api/v1/auth/login/", {"username": "admin", "password": PASSWORD}, format="json", HTTP_X_CSRFTOKEN=token
    )
    token = client.cookies["csrftoken"].value  # rotated at login

    without_token = client.post("/api/v1/auth/logout/")
    still_in = client.get("/api/v1/me/").status_code
    with_token = client.post("/api/v1/auth/logout/", HTTP_X_CSRFTOKEN=token)

    assert (without_token.status_code, still_in) == (403, 200)
    assert with_token.status_code == 204
    assert client.get("/api/v1/me/").status_code == 401


def test_a_session_write_to_the_api_needs_the_csrf_header(admin: User, team: Any) -> None:
    client = APIClient(enforce_csrf_checks=True)
    token = client.get("/api/v1/auth/config/").cookies["csrftoken"].value
    client.post(
        "/api/v1/auth/login/", {"username": "admin", "password": PASSWORD}, format="json", HTTP_X_CSRFTOKEN=token
    )

    response = client.post("/api/v1/tokens/", {"name": "laptop"}, format="json")

    assert response.status_code == 403
    assert admin.api_tokens.count() == 0

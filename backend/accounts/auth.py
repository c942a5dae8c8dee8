"""DRF authentication with personal API tokens (Bearer or Token scheme), the
signed-in user of an API request, and the local password login (with its
lockouts: backend/accounts/services/lockout.py)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.http import HttpRequest
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from backend.accounts.models import User
from backend.accounts.selectors import api_token_expired_at, api_token_refused_account_at, user_for_token
from backend.accounts.services.lockout import (
    SignInLocked,
    note_lockout,
    sign_in_attempt,
    sign_in_failed,
    sign_in_succeeded,
)
from backend.core.ratelimit import client_ip
from backend.core.tokens import API_TOKEN_PREFIX, token_kind


def signed_in_user(request: Request) -> User:
    """The user of an API request. Views require authentication
    (``IsAuthenticated`` by default), so an anonymous one is refused with a 401."""
    user = request.user
    if not isinstance(user, User):
        raise exceptions.NotAuthenticated()
    return user


def token_from_header(value: str) -> str | None:
    scheme, _, token = value.partition(" ")
    if scheme.lower() in {"bearer", "token"} and token.strip():
        return token.strip()
    return None


class ApiTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Any) -> tuple[User, None] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        token = token_from_header(header)
        if token is None:
            raise exceptions.AuthenticationFailed("Use the header 'Authorization: Bearer <token>'.")
        user = user_for_token(token=token)
        if user is None:
            raise exceptions.AuthenticationFailed(_refusal(token))
        return user, None

    def authenticate_header(self, request: Any) -> str:
        return "Bearer"


def _refusal(token: str) -> str:
    """Why an API token is refused, in words that say what to do."""
    kind = token_kind(token)
    if kind in ("runner", "registration"):
        return (
            f"This is a {kind} token ({token[:6]}…), not a personal API token ({API_TOKEN_PREFIX}…): make one"
            " on the dashboard's API tokens page or with `trainyard token create`."
        )
    refused = api_token_refused_account_at(token=token)
    if refused is not None:
        return (
            f"Since {refused:%Y-%m-%d %H:%M} UTC this token's GitHub account is no longer allowed on this server"
            " (TRAINYARD_GITHUB_ALLOW: a login, an id or an organization it is an active member of). Once it is"
            " again, sign in in the browser: the account and its tokens then work again."
        )
    expired = api_token_expired_at(token=token)
    if expired is not None:
        return (
            f"This API token expired at {expired:%Y-%m-%d %H:%M} UTC: sign in again with `trainyard login`, or make"
            " a new one (`trainyard token create`, or the dashboard's API tokens page)."
        )
    return "This API token is unknown or revoked: make a new one (python manage.py issue_token USERNAME)."


class LocalLoginBackend(ModelBackend):
    """Username and password (the local ``admin``), only while ``TRAINYARD_LOCAL_LOGIN`` is on.

    Switching it off also ends the sessions it started. GitHub users have an
    unusable password, so this never signs them in.

    Every password check here, the API's login and the Django admin's, is
    counted against the username's and the address's lockouts: a locked one
    raises ``SignInLocked`` (Django's ``authenticate()`` then stops and
    answers None; ``lockout_of(request)`` says why) before the password is
    checked, the right one too.
    """

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> User | None:
        if not settings.TRAINYARD_LOCAL_LOGIN:
            return None
        if username is None or password is None:  # not a password sign-in (social-auth's, say)
            return super().authenticate(request, username=username, password=password, **kwargs)
        try:
            attempt = sign_in_attempt(username=username, address=client_ip(request) if request is not None else "")
        except SignInLocked as locked:
            if request is not None:
                note_lockout(request, locked.refusal)
            raise
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            sign_in_failed(attempt)
        else:
            sign_in_succeeded(attempt)
        return user

    def get_user(self, user_id: Any) -> User | None:
        if not settings.TRAINYARD_LOCAL_LOGIN:
            return None
        return super().get_user(user_id)

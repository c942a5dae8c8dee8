"""DRF authentication with personal API tokens (Bearer or Token scheme)."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions

from backend.accounts.models import User
from backend.accounts.selectors import user_for_token


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
            raise exceptions.AuthenticationFailed(
                "This API token is unknown or revoked: make a new one (python manage.py issue_token USERNAME)."
            )
        return user, None

    def authenticate_header(self, request: Any) -> str:
        return "Bearer"

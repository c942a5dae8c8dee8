"""The caller: who they are, signing in and out, their API tokens; health."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate, login, logout
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import ensure_csrf_cookie
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.accounts.auth import signed_in_user
from backend.accounts.github import github_enabled
from backend.accounts.models import AuditKind, Role, User
from backend.accounts.selectors import api_tokens_of, default_workspace, memberships_of
from backend.accounts.services.audit import Actor, audit_record
from backend.accounts.services.lockout import lockout_of
from backend.accounts.services.tokens import api_token_default_lifetime, api_token_issue, api_token_revoke
from backend.core.errors import ApplicationError, NotFound
from backend.core.ratelimit import client_ip
from backend.core.throttling import RateLimited

DURATION = r"^(?:[1-9][0-9]{0,6}[smhdw]|never)$"
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class WorkspaceRefOut(serializers.Serializer):
    slug = serializers.SlugField()
    name = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.choices)


class MeOut(serializers.Serializer):
    username = serializers.CharField()
    avatar_url = serializers.CharField()
    default_workspace = serializers.SlugField(allow_null=True)
    workspaces = WorkspaceRefOut(many=True)


class AuthConfigOut(serializers.Serializer):
    github = serializers.BooleanField()
    local_login = serializers.BooleanField()


class LoginIn(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=1024, trim_whitespace=False)


class TokenIn(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    expires_in = serializers.RegexField(
        DURATION,
        required=False,
        allow_blank=True,
        help_text="Lifetime: 30d, 12h, 90m, 2w (at most 3650d), or never. "
        "Absent or empty: TRAINYARD_API_TOKEN_DAYS (90).",
        error_messages={
            "invalid": "Say how long the token lives as a number and a unit (30d, 12h, 90m or 2w), or never."
        },
    )

    def validate_expires_in(self, value: str) -> timedelta | None:
        if value == "never":
            return None
        if not value:
            return api_token_default_lifetime()
        lifetime = timedelta(seconds=int(value[:-1]) * DURATION_UNITS[value[-1]])
        if not timedelta(minutes=1) <= lifetime <= timedelta(days=3650):
            raise serializers.ValidationError("A token lives between 1 minute and 3650 days.")
        return lifetime


class TokenOut(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    prefix = serializers.CharField()
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True, help_text="null: never expires.")


class TokenCreatedOut(TokenOut):
    token = serializers.CharField(help_text="The token itself: shown this once.")


class MeView(APIView):
    @extend_schema(responses=MeOut)
    def get(self, request: Request) -> Response:
        return Response(_me(signed_in_user(request)))


@method_decorator(ensure_csrf_cookie, name="dispatch")
class AuthConfigView(APIView):
    """Public: which sign-in methods the web app offers. Sets the ``csrftoken`` cookie."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    @extend_schema(responses=AuthConfigOut)
    def get(self, request: Request) -> Response:
        return Response({"github": github_enabled(), "local_login": settings.TRAINYARD_LOCAL_LOGIN})


class LoginView(APIView):
    """The local password login; CSRF-checked although anonymous, so no site can sign a browser in.

    A username or an address locked out after too many wrong passwords is
    refused (429, with Retry-After) whatever the password
    (backend/accounts/services/lockout.py)."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_scopes = {"POST": "login"}

    @staticmethod
    def throttle_user(request: Request) -> str:
        """Per user: the username tried, whoever tries it (a password guesser spreads over addresses)."""
        username = request.data.get("username") if isinstance(request.data, dict) else None
        return f"login:{username.strip().lower()}" if isinstance(username, str) and username.strip() else ""

    @extend_schema(request=LoginIn, responses=MeOut)
    def post(self, request: Request) -> Response:
        SessionAuthentication().enforce_csrf(request)
        if not settings.TRAINYARD_LOCAL_LOGIN:
            raise ApplicationError("local login is disabled", status_code=403)
        data = LoginIn(data=request.data)
        data.is_valid(raise_exception=True)
        user = authenticate(request._request, **data.validated_data)
        if user is None:
            locked = lockout_of(request._request)
            if locked is not None:
                raise RateLimited(locked)
            raise ApplicationError("Wrong username or password.")
        login(request._request, user)
        return Response(_me(user))


class LogoutView(APIView):
    permission_classes = [AllowAny]

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Request) -> Response:
        logout(request._request)
        return Response(status=204)


class TokenListView(APIView):
    """The caller's own API tokens."""

    throttle_scopes = {"POST": "token"}

    @extend_schema(responses=TokenOut(many=True))
    def get(self, request: Request) -> Response:
        return Response(TokenOut(api_tokens_of(user=signed_in_user(request)), many=True).data)

    @extend_schema(request=TokenIn, responses={201: TokenCreatedOut})
    def post(self, request: Request) -> Response:
        data = TokenIn(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        user = signed_in_user(request)
        lifetime = fields["expires_in"] if "expires_in" in fields else api_token_default_lifetime()
        issued = api_token_issue(user=user, name=fields["name"], expires_in=lifetime)
        _audit_token(request, user, "token.api_created", issued.row.name, str(issued.row.pk))
        return Response({**TokenOut(issued.row).data, "token": issued.token}, status=201)


class TokenDetailView(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, token_id: Any) -> Response:
        user = signed_in_user(request)
        if not api_token_revoke(user=user, token_id=token_id):
            raise NotFound("Token not found (or revoked already).")
        _audit_token(request, user, "token.api_revoked", "", str(token_id))
        return Response(status=204)


def _audit_token(request: Request, user: User, action: str, name: str, token_id: str) -> None:
    """An API token is a person's, not a workspace's: its events go to the
    audit log of its user's personal workspace (none for a user without one)."""
    personal = getattr(user, "personal_workspace", None)
    if personal is None:
        return
    actor = Actor(user=user, address=client_ip(request))
    audit_record(
        workspace_id=personal.pk,
        kind=AuditKind.TOKEN,
        action=action,
        actor=actor,
        target=name or token_id,
        detail={"token": token_id},
    )


class HealthView(APIView):
    """The server is up and reaches its database; with the limits a client
    checks before an upload (the CLI's size guard reads ``max_blob_bytes``)."""

    authentication_classes = []
    permission_classes = [AllowAny]

    @extend_schema(
        responses=inline_serializer(
            "Health",
            {
                "status": serializers.CharField(),
                "max_blob_bytes": serializers.IntegerField(help_text="The largest code blob accepted (bytes)."),
            },
        )
    )
    def get(self, request: Request) -> Response:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return Response({"status": "ok", "max_blob_bytes": settings.TRAINYARD["MAX_BLOB_BYTES"]})


def _me(user: User) -> dict[str, Any]:
    default = default_workspace(user=user)
    return {
        "username": user.username,
        "avatar_url": user.avatar_url,
        "default_workspace": default.slug if default else None,
        "workspaces": [
            {"slug": m.workspace.slug, "name": m.workspace.name, "role": m.role} for m in memberships_of(user=user)
        ],
    }

"""GitHub sign-in: social-core's GitHub backend with PKCE and configurable URLs.

``GITHUB_URL`` and ``GITHUB_API_URL`` are read at request time, so GitHub
Enterprise works and tests point the backend at a local stand-in. The state
parameter is bound to the session (social-core stores one transaction per
state, with the PKCE verifier in it) and the verifier is sent with the code.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from django.conf import settings
from social_core.backends.github import GithubOAuth2
from social_core.backends.oauth import BaseOAuth2PKCE
from social_core.exceptions import AuthConfigurationError, SocialAuthBaseException

from backend.accounts.models import User
from backend.accounts.services.users import allowlist_orgs, github_allowed_without_orgs


def github_enabled() -> bool:
    return bool(settings.GITHUB_CLIENT_ID and settings.GITHUB_CLIENT_SECRET)


class GithubOAuth2PKCE(GithubOAuth2, BaseOAuth2PKCE):
    """Sign-in only (the pipeline never links to the session's user); ``user:email`` reads private emails."""

    name = "github"
    DEFAULT_SCOPE = ["user:email"]
    PKCE_DEFAULT_CODE_CHALLENGE_METHOD = "S256"
    DEFAULT_USE_PKCE = True

    def start(self) -> Any:
        if not github_enabled():
            raise AuthConfigurationError(self, code="missing_setting", parameter="GITHUB_CLIENT_ID", stage="begin")
        return super().start()

    def get_scope(self) -> list[str]:
        """``read:org`` too when the allowlist names organizations: without it
        GitHub hides private memberships."""
        scope = list(super().get_scope())
        if allowlist_orgs(settings.TRAINYARD_GITHUB_ALLOW) and "read:org" not in scope:
            scope.append("read:org")
        return scope

    def get_key_and_secret(self) -> tuple[str, str]:
        return settings.GITHUB_CLIENT_ID, settings.GITHUB_CLIENT_SECRET

    def authorization_url(self) -> str:
        return f"{settings.GITHUB_URL}/login/oauth/authorize"

    def access_token_url(self) -> str:
        return f"{settings.GITHUB_URL}/login/oauth/access_token"

    def api_url(self) -> str:
        # A trailing slash, or urljoin would drop the last segment (…/api/v3).
        return f"{settings.GITHUB_API_URL}/"

    def user_data(self, access_token: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """``/user`` plus ``verified_emails`` from ``/user/emails``; ``email`` is a verified one or ''.

        The profile's public email is ignored: only addresses GitHub reports
        as verified may ever match anything here.
        """
        data = self._user_data(access_token)
        emails = self._user_data(access_token, "/emails")
        verified = _verified_emails(emails if isinstance(emails, list) else [])
        data["verified_emails"] = [email for email, _ in verified]
        primary = [email for email, is_primary in verified if is_primary]
        data["email"] = (primary or data["verified_emails"] or [""])[0]
        github_id = data.get("id") if isinstance(data.get("id"), int) else None
        data["allowed_orgs"] = self._allowlist_memberships(access_token, str(data.get("login") or ""), github_id)
        return data

    def _allowlist_memberships(self, access_token: str, login: str, github_id: int | None) -> list[str]:
        """The allowlist's organizations the user is an active member of
        (none asked for when the login or the id itself is listed)."""
        allow = settings.TRAINYARD_GITHUB_ALLOW
        if github_allowed_without_orgs(allow, login=login, github_id=github_id):
            return []
        return [org for org in allowlist_orgs(allow) if self._active_member(access_token, org)]

    def _active_member(self, access_token: str, org: str) -> bool:
        url = f"{self.api_url()}user/memberships/orgs/{quote(org)}"
        try:
            membership = self.get_json(url, headers={"Authorization": f"token {access_token}"})
        except SocialAuthBaseException as exc:
            # 404: not a member; 403: the org restricts this app. Anything else: GitHub is failing.
            if getattr(exc, "status_code", None) in (403, 404):
                return False
            raise
        return isinstance(membership, dict) and membership.get("state") == "active"

    def get_user(self, user_id: Any) -> User | None:
        """The session's user while GitHub sign-in is enabled and the account active."""
        if not github_enabled():
            return None
        user = User.objects.filter(pk=user_id, is_active=True).first()
        return user


def _verified_emails(rows: list[Any]) -> list[tuple[str, bool]]:
    return [
        (str(row["email"]).strip().lower(), bool(row.get("primary")))
        for row in rows
        if isinstance(row, dict) and row.get("verified") is True and row.get("email")
    ]

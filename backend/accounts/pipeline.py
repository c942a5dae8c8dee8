"""The GitHub sign-in step of social-auth's pipeline (see SOCIAL_AUTH_PIPELINE)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from social_core.exceptions import AuthPolicyError, AuthResponseError

from backend.accounts.services.users import (
    GithubProfile,
    allowlist_orgs,
    github_allowed_by,
    github_allowed_without_orgs,
    github_sign_in,
)


class NotOnAllowlist(AuthPolicyError):
    """The GitHub account is neither listed in TRAINYARD_GITHUB_ALLOW nor a member of an org listed there."""


def github_allowed(backend: Any, response: dict[str, Any], *args: Any, **kwargs: Any) -> None:
    """Refuses a GitHub account that ``TRAINYARD_GITHUB_ALLOW`` does not name
    (by login, by id, or by an organization GitHub says it is an active member of)."""
    login = response.get("login")
    orgs = response.get("allowed_orgs") or []
    github_id = response.get("id") if isinstance(response.get("id"), int) else None
    if not github_allowed_by(settings.TRAINYARD_GITHUB_ALLOW, login=str(login or ""), orgs=orgs, github_id=github_id):
        raise NotOnAllowlist(backend, "not on TRAINYARD_GITHUB_ALLOW", code="not_allowed", stage="pipeline")


def github_user(backend: Any, uid: str, response: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Finds or creates the user by GitHub's numeric id; never links by email
    or by the session's user. Keeps the sign-in's GitHub token (encrypted)
    when only an organization let the account in: the periodic re-check
    (services/allowlist.py) asks GitHub with it."""
    login = response.get("login")
    if not isinstance(login, str) or not login or not uid.isdigit():
        raise AuthResponseError(backend, code="missing_claim", claim="login", stage="pipeline")
    profile = GithubProfile(
        id=int(uid),
        login=login,
        avatar_url=_http_url(response.get("avatar_url")),
        verified_emails=tuple(response.get("verified_emails") or ()),
        primary_email=str(response.get("email") or ""),
    )
    allow = settings.TRAINYARD_GITHUB_ALLOW
    by_org = bool(allowlist_orgs(allow)) and not github_allowed_without_orgs(allow, login=login, github_id=int(uid))
    token = response.get("access_token")
    signed_in = github_sign_in(profile=profile, org_token=token if by_org and isinstance(token, str) else "")
    return {"user": signed_in.user, "is_new": signed_in.created}


def _http_url(value: object) -> str:
    """The URL when it is http(s); '' otherwise (the web app puts it in an <img src>)."""
    return value if isinstance(value, str) and value.startswith(("https://", "http://")) else ""

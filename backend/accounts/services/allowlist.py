"""TRAINYARD_GITHUB_ALLOW re-checked for accounts that signed in already
(Celery beat: ``github-allow-recheck``; docs/decisions/0094-allowlist-recheck.md).

Sign-in checks the allowlist once; someone taken off it, or who left a
listed organization, must lose access to what they signed in to as well:
their sessions, API tokens and websockets. Each pass:

1. Takes the active GitHub accounts not found allowed for half of
   TRAINYARD_GITHUB_ALLOW_RECHECK_SECONDS, oldest check first, until its
   time budget is spent. Passes run every half interval, so an account is
   looked at again within one interval of its last check.
2. An account the list names by login or ``id:`` is allowed without asking
   GitHub. Otherwise GitHub is asked, with the token of the account's last
   sign-in (kept encrypted), whether it is an active member of a listed
   organization.
3. Allowed: ``allow_checked_at`` moves. Not allowed (no listed organization
   has it, GitHub refuses the token, or no token was kept): the account is
   made inactive, which every session, token and websocket check refuses at
   once, and ``allow_refused_at`` says why. A later sign-in the allowlist
   lets through makes it active again (``users.github_sign_in``); an account
   an admin deactivated stays so.
4. GitHub failing (an error status, a timeout): the account is left as it
   is, logged, and asked again next pass.
"""

from __future__ import annotations

import enum
import logging
import time
from datetime import datetime, timedelta
from urllib.parse import quote

import httpx
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from backend.accounts.models import User
from backend.accounts.services.users import allowlist_orgs, github_allowed_without_orgs
from backend.vault.crypto import Unreadable, decrypt

logger = logging.getLogger(__name__)

RECHECK_BUDGET_SECONDS = 240.0  # per pass; the task's time limit is 300 s
GITHUB_TIMEOUT_SECONDS = 10.0


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    REFUSED = "refused"
    UNKNOWN = "unknown"  # GitHub did not answer: asked again next pass


def github_allow_recheck(
    *, now: datetime | None = None, budget_seconds: float = RECHECK_BUDGET_SECONDS
) -> dict[str, int]:
    """One pass (the module's docstring); how many accounts ended each way."""
    allow = settings.TRAINYARD_GITHUB_ALLOW
    counts = {v.value: 0 for v in Verdict}
    if not allow:
        return counts
    now = now or timezone.now()
    due = now - timedelta(seconds=settings.TRAINYARD_GITHUB_ALLOW_RECHECK_SECONDS / 2)
    deadline = time.monotonic() + budget_seconds
    accounts = (
        User.objects.filter(github_id__isnull=False, is_active=True)
        .filter(Q(allow_checked_at__isnull=True) | Q(allow_checked_at__lte=due))
        .order_by("allow_checked_at", "pk")
        .only("pk", "github_id", "github_login", "github_token")
    )
    for user in accounts.iterator(chunk_size=200):
        if time.monotonic() > deadline:
            break
        verdict, why = github_account_verdict(user=user, allow=allow)
        counts[verdict.value] += 1
        _record(user, verdict, why, now)
    return counts


def github_account_verdict(*, user: User, allow: list[str]) -> tuple[Verdict, str]:
    """Whether the allowlist lets ``user`` in now, and why not."""
    if github_allowed_without_orgs(allow, login=user.github_login, github_id=user.github_id):
        return Verdict.ALLOWED, ""
    orgs = allowlist_orgs(allow)
    if not orgs:
        return Verdict.REFUSED, "the allowlist no longer names this account"
    token = _token_of(user)
    if not token:
        return Verdict.REFUSED, "no GitHub token of a sign-in is kept to ask GitHub with: sign in again"
    answers = [_membership(token, org) for org in orgs]
    if Verdict.ALLOWED in answers:
        return Verdict.ALLOWED, ""
    if Verdict.UNKNOWN in answers:
        return Verdict.UNKNOWN, ""
    return Verdict.REFUSED, f"not an active member of {', '.join(orgs)} (or GitHub refused the sign-in's token)"


def _record(user: User, verdict: Verdict, why: str, now: datetime) -> None:
    if verdict is Verdict.ALLOWED:
        User.objects.filter(pk=user.pk).update(allow_checked_at=now)
    elif verdict is Verdict.REFUSED:
        # Compare-and-set on is_active: an account deactivated meanwhile keeps its record.
        if User.objects.filter(pk=user.pk, is_active=True).update(is_active=False, allow_refused_at=now):
            logger.warning(
                "security: GitHub account %s (id %s) is no longer allowed to sign in (%s): "
                "its sessions and API tokens are refused from now on",
                user.github_login,
                user.github_id,
                why,
            )
    else:
        logger.warning(
            "GitHub did not answer about account %s (id %s); asked again next pass", user.github_login, user.github_id
        )


def _token_of(user: User) -> str:
    if user.github_token is None:
        return ""
    try:
        return decrypt(user.github_token)
    except Unreadable:
        return ""


def _membership(token: str, org: str) -> Verdict:
    """GitHub's ``GET /user/memberships/orgs/{org}`` with the account's token."""
    url = f"{settings.GITHUB_API_URL}/user/memberships/orgs/{quote(org)}"
    headers = {"Authorization": f"token {token}", "Accept": "application/vnd.github+json"}
    try:
        answer = httpx.get(url, headers=headers, timeout=GITHUB_TIMEOUT_SECONDS, follow_redirects=False)
    except httpx.HTTPError as exc:
        logger.warning("GitHub: asking about membership of %s failed: %s", org, exc)
        return Verdict.UNKNOWN
    # 401: the token was revoked (the person took back the app's access);
    # 403: the organization restricts this app; 404: not a member.
    if answer.status_code in (401, 403, 404):
        return Verdict.REFUSED
    if answer.status_code != 200:
        logger.warning("GitHub: membership of %s answered %s", org, answer.status_code)
        return Verdict.UNKNOWN
    body = answer.json()
    return Verdict.ALLOWED if isinstance(body, dict) and body.get("state") == "active" else Verdict.REFUSED

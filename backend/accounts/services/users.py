"""Users: local ones (admin, issue_token) and GitHub sign-in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from backend.accounts.models import User
from backend.accounts.services.workspaces import invitations_accept, workspace_create_personal
from backend.vault.crypto import encrypt


@dataclass(frozen=True)
class GithubProfile:
    """What GitHub said about the person signing in; emails are the verified ones only."""

    id: int
    login: str
    avatar_url: str = ""
    verified_emails: tuple[str, ...] = ()
    primary_email: str = ""


@dataclass(frozen=True)
class SignIn:
    user: User
    created: bool


@transaction.atomic
def user_get_or_create(*, username: str, email: str = "") -> User:
    """The user, created with a personal workspace if new."""
    user, created = User.objects.get_or_create(username=username, defaults={"email": email})
    if created:
        workspace_create_personal(user=user)
    return user


@transaction.atomic
def github_sign_in(*, profile: GithubProfile, org_token: str = "") -> SignIn:
    """The user with GitHub id ``profile.id``, brought up to date; created at first sign-in.

    Never matched by email or username: an account is GitHub's numeric id.

    1. Find the user by ``github_id`` (locked), or create one with an
       unusable password and a personal workspace.
    2. ``username`` follows the login: the login itself, or
       ``<login>-<github id>`` while another account holds that name.
    3. Store login, avatar and the primary verified email; clear the login
       from any other account (GitHub logins are unique, so theirs is stale).
    4. The allowlist let it in just now: it is found allowed as of now, an
       account a re-check had refused is active again, and ``org_token``
       (the sign-in's GitHub token, when an organization let it in) is kept
       encrypted for the next re-checks; none is kept otherwise.
    5. Accept pending invitations for the id, the login or a verified email.
    """
    user = User.objects.select_for_update().filter(github_id=profile.id).first()
    created = user is None
    if user is None:
        user = User(github_id=profile.id, username=_username_for(profile, None))
        user.set_unusable_password()
    else:
        user.username = _username_for(profile, user.pk)
    user.github_login = profile.login.lower()
    user.avatar_url = profile.avatar_url[:500]
    user.email = profile.primary_email
    if user.allow_refused_at is not None:
        user.is_active, user.allow_refused_at = True, None
    user.allow_checked_at = timezone.now()
    user.github_token = encrypt(org_token) if org_token else None
    user.save()
    if created:
        workspace_create_personal(user=user)
    User.objects.filter(github_login=user.github_login).exclude(pk=user.pk).update(github_login="")
    invitations_accept(user=user, github_login=user.github_login, verified_emails=profile.verified_emails)
    return SignIn(user=user, created=created)


def github_allowed_by(allow: Sequence[str], *, login: str, orgs: Sequence[str], github_id: int | None = None) -> bool:
    """Whether an allowlist (GitHub logins, ``id:<GitHub id>`` and
    ``org:<name>``, lower-case) lets the account ``github_id`` with ``login``,
    an active member of ``orgs``, sign in; an empty list lets everyone."""
    if not allow:
        return True
    names = {login.lower(), *(f"org:{org.lower()}" for org in orgs)}
    if github_id is not None:
        names.add(f"id:{github_id}")
    return bool(names & set(allow))


def github_allowed_without_orgs(allow: Sequence[str], *, login: str, github_id: int | None) -> bool:
    """Whether the allowlist names the account itself (its login or its id),
    so no organization need be asked about."""
    names = {login.lower(), *([f"id:{github_id}"] if github_id is not None else [])}
    return bool(names & set(allow))


def allowlist_orgs(allow: Sequence[str]) -> list[str]:
    """The organizations an allowlist names (``org:acme`` → ``acme``)."""
    return [entry.removeprefix("org:") for entry in allow if entry.startswith("org:")]


def _username_for(profile: GithubProfile, user_pk: int | None) -> str:
    """The login if no other account holds it (case-insensitively), else ``<login>-<id>`` (then ``-2``, ``-3`` …)."""
    others = User.objects.exclude(pk=user_pk) if user_pk is not None else User.objects.all()
    candidates = [profile.login, f"{profile.login}-{profile.id}"]
    n = 2
    while True:
        for name in candidates:
            if not others.filter(username__iexact=name).exists():
                return name
        candidates, n = [f"{profile.login}-{profile.id}-{n}"], n + 1

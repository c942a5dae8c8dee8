"""Workspaces, their members and invitations.

Every change to a workspace's members locks the workspace row first, so two
admins demoting each other at once cannot leave it without an admin.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from backend.accounts.guards import guard_defaults_parse, guard_defaults_written
from backend.accounts.models import ROLE_RANK, Invitation, Membership, Role, User, Workspace, invitation_expiry
from backend.core.errors import ApplicationError, NotFound


@dataclass(frozen=True)
class MemberAdded:
    """Either the new membership (the person has an account) or the pending invitation."""

    membership: Membership | None = None
    invitation: Invitation | None = None


def workspace_create_personal(*, user: User) -> Workspace:
    slug = _free_slug(slugify(user.username) or "user")
    workspace = Workspace.objects.create(slug=slug, name=user.username, personal_owner=user)
    Membership.objects.create(workspace=workspace, user=user, role=Role.ADMIN)
    return workspace


def workspace_create_team(*, user: User, name: str, slug: str = "") -> Workspace:
    """A team workspace with ``user`` as its admin; ``slug`` from the name when
    not given. Refused (403) when ``user`` has made
    TRAINYARD_MAX_WORKSPACES_PER_USER already (each workspace has its own
    storage quota: the cap keeps one account from multiplying it)."""
    if slug and slugify(slug) != slug:
        raise ApplicationError(f"{slug!r} is not a valid slug: use lower-case letters, digits and hyphens.")
    chosen = slug or _free_slug(slugify(name) or "team")
    try:
        with transaction.atomic():
            _workspace_cap_check(user)
            workspace = Workspace.objects.create(slug=chosen, name=name, created_by=user)
            Membership.objects.create(workspace=workspace, user=user, role=Role.ADMIN)
    except IntegrityError:
        raise ApplicationError(f"The workspace slug {chosen!r} is taken: choose another.") from None
    return workspace


@transaction.atomic
def member_add(
    *,
    workspace: Workspace,
    invited_by: User,
    role: Role,
    github_login: str = "",
    email: str = "",
    github_id: int | None = None,
) -> MemberAdded:
    """Adds the person with this GitHub login or verified email, or invites them.

    An email matches only an account whose email came verified from GitHub;
    anyone else gets an invitation, taken up when they sign in with that
    login or a verified email. With ``github_id`` (GitHub's numeric id of
    the login) only the account of that id matches, now or at its sign-in:
    GitHub gives freed logins to others. Inviting again changes the pending role.
    """
    github_login, email = github_login.strip().lower(), email.strip().lower()
    if bool(github_login) == bool(email):
        raise ApplicationError("Give either a GitHub login or an email.")
    if github_id is not None and not github_login:
        raise ApplicationError("A GitHub id goes with the GitHub login it belongs to.")
    _lock(workspace)
    user = _account_for(github_login=github_login, email=email, github_id=github_id)
    if user is None:
        return MemberAdded(invitation=_invite(workspace, invited_by, role, github_login, email, github_id))
    existing = Membership.objects.for_workspace(workspace).filter(user=user).first()
    if existing is not None:
        raise ApplicationError(
            f"{user.username} is already a member of {workspace.slug} ({existing.role}): change their role instead."
        )
    return MemberAdded(membership=Membership.objects.create(workspace=workspace, user=user, role=role))


@transaction.atomic
def member_role_set(*, workspace: Workspace, username: str, role: Role) -> Membership:
    _lock(workspace)
    membership = _membership(workspace, username)
    if role != Role.ADMIN:
        _keep_an_admin(workspace, membership, "demote")
    Membership.objects.filter(pk=membership.pk).update(role=role, updated_at=timezone.now())
    membership.role = role
    return membership


@transaction.atomic
def member_remove(*, workspace: Workspace, username: str) -> None:
    _lock(workspace)
    membership = _membership(workspace, username)
    _keep_an_admin(workspace, membership, "remove")
    membership.delete()


@dataclass(frozen=True)
class GuardDefaultsChange:
    """A workspace's default guards before and after a change, as written
    (``guard_defaults_written``): what the API answers and the audit records."""

    before: dict[str, dict[str, object] | None]
    after: dict[str, dict[str, object] | None]

    @property
    def changed(self) -> bool:
        return self.before != self.after


# The problems a refusal lists (each names its key and what a good value
# looks like): a body of a thousand unknown keys gets a message of a few lines.
GUARD_PROBLEMS_SHOWN = 10


@transaction.atomic
def workspace_guard_defaults_set(*, workspace: Workspace, value: object) -> GuardDefaultsChange:
    """Replaces the workspace's default guards with ``value``, written as in
    a workflow (``{"stall": {"timeout": "20m", "action": "restart"},
    "utilization_policy": null}``; a key left out or null: no default), and
    checked as the Django admin checks them (``accounts.guards``). Stored
    as written, durations normalised (``90m`` → ``1h30m``). Runs submitted
    from now on get them; runs already submitted keep theirs."""
    problems = guard_defaults_parse(value)[1]
    if problems:
        shown = problems[:GUARD_PROBLEMS_SHOWN]
        more = f"; and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
        raise ApplicationError(f"Guard defaults not changed: {'; '.join(shown)}{more}", extra={"problems": shown})
    _lock(workspace)
    before = guard_defaults_written(Workspace.objects.values_list("guard_defaults", flat=True).get(pk=workspace.pk))
    after = guard_defaults_written(value)
    stored = {key: written for key, written in after.items() if written is not None}
    Workspace.objects.filter(pk=workspace.pk).update(guard_defaults=stored, updated_at=timezone.now())
    workspace.guard_defaults = stored
    return GuardDefaultsChange(before=before, after=after)


def invitation_revoke(*, workspace: Workspace, invitation_id: uuid.UUID) -> None:
    """Deletes a pending invitation (an expired one too)."""
    deleted, _ = Invitation.objects.for_workspace(workspace).filter(pk=invitation_id, accepted_at__isnull=True).delete()
    if not deleted:
        raise NotFound("Invitation not found (it may have been accepted or revoked).")


def invitations_accept(*, user: User, github_login: str, verified_emails: Sequence[str]) -> list[Membership]:
    """Turns the pending invitations for this login or these (verified) emails into memberships.

    A login invitation that names a GitHub id is the account's with that id
    only (a recycled login does not take it up). Expired invitations are
    ignored. Where one workspace invited the person twice, the higher role
    wins; an existing membership keeps its role. Each invitation is claimed with a
    compare-and-set, so it is accepted once.
    """
    match = Q(email__in=[e.lower() for e in verified_emails if e])
    if user.github_id is not None:
        match |= Q(github_id=user.github_id)
    if github_login:
        match |= Q(github_login=github_login.lower(), github_id__isnull=True)
    pending = list(Invitation.objects.filter(match, accepted_at__isnull=True, expires_at__gt=timezone.now()))
    pending.sort(key=lambda inv: ROLE_RANK[Role(inv.role)], reverse=True)
    joined = []
    for invitation in pending:
        claimed = Invitation.objects.filter(pk=invitation.pk, accepted_at__isnull=True).update(
            accepted_at=timezone.now(), accepted_by=user
        )
        if claimed:
            membership, created = Membership.objects.get_or_create(
                workspace_id=invitation.workspace_id, user=user, defaults={"role": invitation.role}
            )
            joined += [membership] if created else []
    return joined


def _lock(workspace: Workspace) -> None:
    Workspace.objects.select_for_update().filter(pk=workspace.pk).first()


def _membership(workspace: Workspace, username: str) -> Membership:
    membership = (
        Membership.objects.for_workspace(workspace).select_related("user").filter(user__username=username).first()
    )
    if membership is None:
        raise NotFound(f"{username!r} is not a member of {workspace.slug}.")
    return membership


def _keep_an_admin(workspace: Workspace, membership: Membership, action: str) -> None:
    if workspace.personal_owner_id == membership.user_id:
        raise ApplicationError(
            f"{membership.user.username} owns the personal workspace {workspace.slug}: cannot {action} them."
        )
    if membership.role != Role.ADMIN:
        return
    others = Membership.objects.for_workspace(workspace).filter(role=Role.ADMIN).exclude(pk=membership.pk)
    if not others.exists():
        raise ApplicationError(
            f"{membership.user.username} is the last admin of {workspace.slug}: make someone else admin first."
        )


def _account_for(*, github_login: str, email: str, github_id: int | None) -> User | None:
    accounts = User.objects.filter(github_id__isnull=False, is_active=True)
    if github_id is not None:
        return accounts.filter(github_id=github_id).first()
    if github_login:
        return accounts.filter(github_login=github_login).first()
    # Only GitHub accounts: their email is one GitHub reported verified.
    return accounts.filter(email__iexact=email).order_by("-last_login").first()


def _invite(
    workspace: Workspace, invited_by: User, role: Role, github_login: str, email: str, github_id: int | None
) -> Invitation:
    invitation, _ = Invitation.objects.update_or_create(
        workspace=workspace,
        github_login=github_login,
        email=email,
        accepted_at=None,
        # Inviting again (an expired invitation too) renews it, and sets or clears its id.
        defaults={"role": role, "invited_by": invited_by, "expires_at": invitation_expiry(), "github_id": github_id},
    )
    return invitation


def _workspace_cap_check(user: User) -> None:
    cap = settings.TRAINYARD["MAX_WORKSPACES_PER_USER"]
    if not cap or user.is_superuser:
        return
    # The user's row locked: two creations at once cannot both take the last place.
    User.objects.select_for_update().filter(pk=user.pk).values_list("pk", flat=True).first()
    made = Workspace.objects.filter(created_by=user).count()
    if made >= cap:
        raise ApplicationError(
            f"You have made {made} workspaces, the most one account may make on this server "
            f"(TRAINYARD_MAX_WORKSPACES_PER_USER={cap}): work in one you are a member of, or ask the "
            "installation's admin to raise the limit.",
            status_code=403,
            extra={"workspaces": made, "limit": cap},
        )


def _free_slug(base: str) -> str:
    slug, n = base[:60], 1
    while Workspace.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base[:56]}-{n}"
    return slug

"""Every new endpoint, every kind of caller; a denied request changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from backend.accounts.models import ApiToken, Invitation, Membership, Role, Workspace
from tests.support.fixtures import Person

WS = "/api/v1/workspaces/acme"


@pytest.fixture
def invitation(team: Workspace, owner: Person) -> Invitation:
    return Invitation.objects.create(workspace=team, github_login="someone", role=Role.MEMBER, invited_by=owner.user)


def _endpoints(invitation: Invitation) -> dict[str, tuple[str, str, Any]]:
    return {
        "members": ("get", f"{WS}/members/", None),
        "invitations": ("get", f"{WS}/invitations/", None),
        "member-add": ("post", f"{WS}/members/", {"github_login": "newcomer", "role": "viewer"}),
        "member-role": ("patch", f"{WS}/members/mateo/", {"role": "viewer"}),
        "member-remove": ("delete", f"{WS}/members/vera/", None),
        "invitation-revoke": ("delete", f"{WS}/invitations/{invitation.pk}/", None),
    }


READ_OK = {"members": 200}
# Pending invitations name people who are not members yet: admins only, reads too.
ADMIN_OK = {"invitations": 200, "member-add": 202, "member-role": 200, "member-remove": 204, "invitation-revoke": 204}


def _state(team: Workspace) -> tuple[Any, ...]:
    memberships = sorted(Membership.objects.for_workspace(team).values_list("user__username", "role"))
    invitations = sorted(Invitation.objects.for_workspace(team).values_list("github_login", "role", "accepted_at"))
    return tuple(memberships), tuple(invitations)


def _call(client: APIClient, method: str, url: str, body: Any) -> int:
    return getattr(client, method)(url, body, format="json").status_code


@pytest.mark.parametrize("endpoint", [*READ_OK, *ADMIN_OK])
@pytest.mark.parametrize("who", ["anonymous", "outsider", "viewer", "member", "owner"])
def test_workspace_endpoints_by_role(
    who: str,
    endpoint: str,
    team: Workspace,
    owner: Person,
    member: Person,
    viewer: Person,
    outsider: Person,
    invitation: Invitation,
    request: pytest.FixtureRequest,
) -> None:
    client = APIClient() if who == "anonymous" else request.getfixturevalue(who).client()
    method, url, body = _endpoints(invitation)[endpoint]
    before = _state(team)

    status = _call(client, method, url, body)

    expected = {**READ_OK, **ADMIN_OK}[endpoint]
    if who == "anonymous":
        expected = 401
    elif who == "outsider":
        expected = 404
    elif who in ("viewer", "member") and endpoint in ADMIN_OK:
        expected = 403
    assert status == expected
    if status >= 400 or endpoint in READ_OK or endpoint == "invitations":
        assert _state(team) == before


USER_ENDPOINTS = {
    "me": ("get", "/api/v1/me/", None, 200),
    "workspaces": ("get", "/api/v1/workspaces/", None, 200),
    "workspace-create": ("post", "/api/v1/workspaces/", {"name": "New Team"}, 201),
    "tokens": ("get", "/api/v1/tokens/", None, 200),
    "token-create": ("post", "/api/v1/tokens/", {"name": "laptop"}, 201),
}


def _user_state() -> tuple[int, int, int]:
    return Workspace.objects.count(), Membership.objects.count(), ApiToken.objects.count()


@pytest.mark.parametrize("endpoint", USER_ENDPOINTS)
@pytest.mark.parametrize("who", ["anonymous", "outsider", "viewer", "member", "owner"])
def test_caller_endpoints_need_only_a_signed_in_caller(
    who: str,
    endpoint: str,
    team: Workspace,
    owner: Person,
    member: Person,
    viewer: Person,
    outsider: Person,
    request: pytest.FixtureRequest,
) -> None:
    client = APIClient() if who == "anonymous" else request.getfixturevalue(who).client()
    method, url, body, ok = USER_ENDPOINTS[endpoint]
    before = _user_state()

    status = _call(client, method, url, body)

    assert status == (401 if who == "anonymous" else ok)
    if status >= 400:
        assert _user_state() == before


@pytest.mark.parametrize("who", ["anonymous", "outsider", "owner"])
def test_only_its_owner_revokes_a_token(
    who: str, member: Person, outsider: Person, owner: Person, request: pytest.FixtureRequest
) -> None:
    token = member.user.api_tokens.get()
    client = APIClient() if who == "anonymous" else request.getfixturevalue(who).client()

    status = client.delete(f"/api/v1/tokens/{token.pk}/").status_code

    assert status == (401 if who == "anonymous" else 404)
    token.refresh_from_db()
    assert token.revoked_at is None


def test_an_outsider_cannot_manage_members_through_their_own_workspace(
    team: Workspace, member: Person, outsider: Person
) -> None:
    slug = outsider.user.personal_workspace.slug
    client = outsider.client()

    assert (
        client.patch(f"/api/v1/workspaces/{slug}/members/mateo/", {"role": "admin"}, format="json").status_code == 404
    )
    assert client.delete(f"/api/v1/workspaces/{slug}/members/mateo/").status_code == 404
    assert Membership.objects.get(workspace=team, user=member.user).role == Role.MEMBER

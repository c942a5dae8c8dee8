"""Team workspaces, members, invitations and API tokens through the API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from backend.accounts.models import ApiToken, Invitation, Membership, Role, User, Workspace
from backend.accounts.services.users import GithubProfile, github_sign_in
from tests.support.fixtures import Person

pytestmark = pytest.mark.django_db

WS = "/api/v1/workspaces/acme"


def _github_user(login: str, github_id: int, email: str = "") -> User:
    profile = GithubProfile(id=github_id, login=login, verified_emails=(email,) if email else (), primary_email=email)
    return github_sign_in(profile=profile).user


def test_creating_a_team_workspace_makes_the_caller_its_admin(outsider: Person) -> None:
    response = outsider.client().post("/api/v1/workspaces/", {"name": "Vision Team"}, format="json")

    assert response.status_code == 201
    assert response.json() == {"slug": "vision-team", "name": "Vision Team", "role": "admin", "personal": False}
    workspace = Workspace.objects.get(slug="vision-team")
    assert workspace.personal_owner is None
    assert Membership.objects.get(workspace=workspace).user == outsider.user


def test_a_taken_slug_is_refused(team: Workspace, outsider: Person) -> None:
    response = outsider.client().post("/api/v1/workspaces/", {"name": "Mine", "slug": "acme"}, format="json")

    assert response.status_code == 400
    assert response.json()["message"] == "The workspace slug 'acme' is taken: choose another."
    assert not Membership.objects.filter(workspace=team, user=outsider.user).exists()


def test_workspaces_lists_the_callers_with_role_and_personal(team: Workspace, viewer: Person) -> None:
    assert viewer.client().get("/api/v1/workspaces/").json() == [
        {"slug": "acme", "name": "Acme", "role": "viewer", "personal": False},
        {"slug": "vera", "name": "vera", "role": "admin", "personal": True},
    ]


def test_members_are_listed_with_role_avatar_and_join_date(team: Workspace, owner: Person, viewer: Person) -> None:
    User.objects.filter(pk=owner.user.pk).update(avatar_url="https://avatars.example.test/o")

    rows = viewer.client().get(f"{WS}/members/").json()

    assert [(r["username"], r["role"], r["avatar_url"]) for r in rows] == [
        ("olivia", "admin", "https://avatars.example.test/o"),
        ("vera", "viewer", ""),
    ]
    assert all(r["joined_at"] for r in rows)


def test_adding_an_existing_github_user_by_login_makes_them_a_member(team: Workspace, owner: Person) -> None:
    octo = _github_user("octo", 101)

    response = owner.client().post(f"{WS}/members/", {"github_login": "Octo", "role": "member"}, format="json")

    assert response.status_code == 201
    assert response.json()["member"]["username"] == "octo"
    assert Membership.objects.get(workspace=team, user=octo).role == Role.MEMBER
    assert Invitation.objects.count() == 0


def test_adding_by_a_verified_github_email_makes_them_a_member(team: Workspace, owner: Person) -> None:
    octo = _github_user("octo", 101, email="octo@example.com")

    response = owner.client().post(f"{WS}/members/", {"email": "OCTO@example.com", "role": "viewer"}, format="json")

    assert response.status_code == 201
    assert Membership.objects.get(workspace=team, user=octo).role == Role.VIEWER


def test_a_local_users_unverified_email_gets_an_invitation_not_a_membership(team: Workspace, owner: Person) -> None:
    local = User.objects.create(username="lou", email="lou@example.com")

    response = owner.client().post(f"{WS}/members/", {"email": "lou@example.com", "role": "admin"}, format="json")

    assert response.status_code == 202
    invitation = response.json()["invitation"]
    assert (invitation["email"], invitation["github_login"], invitation["role"]) == ("lou@example.com", "", "admin")
    assert not Membership.objects.filter(workspace=team, user=local).exists()


def test_inviting_again_changes_the_pending_role(team: Workspace, owner: Person) -> None:
    client = owner.client()
    first = client.post(f"{WS}/members/", {"github_login": "newbie", "role": "viewer"}, format="json").json()
    second = client.post(f"{WS}/members/", {"github_login": "NEWBIE", "role": "admin"}, format="json").json()

    assert first["invitation"]["id"] == second["invitation"]["id"]
    assert client.get(f"{WS}/invitations/").json() == [
        {**second["invitation"], "github_login": "newbie", "role": "admin"}
    ]


def test_an_invitation_then_sign_in_makes_a_membership(team: Workspace, owner: Person) -> None:
    owner.client().post(f"{WS}/members/", {"github_login": "newbie", "role": "viewer"}, format="json")

    newbie = _github_user("newbie", 303)

    assert Membership.objects.get(workspace=team, user=newbie).role == Role.VIEWER
    assert owner.client().get(f"{WS}/invitations/").json() == []


def test_adding_someone_twice_is_a_400(team: Workspace, owner: Person, member: Person) -> None:
    User.objects.filter(pk=member.user.pk).update(github_id=5, github_login="mateo")

    response = owner.client().post(f"{WS}/members/", {"github_login": "mateo", "role": "admin"}, format="json")

    assert response.status_code == 400
    assert "already a member" in response.json()["message"]
    assert Membership.objects.get(workspace=team, user=member.user).role == Role.MEMBER


@pytest.mark.parametrize(
    "body",
    [
        {"role": "member"},
        {"github_login": "a", "email": "a@example.com"},
        {"github_login": "no spaces"},
        {"email": "x"},
    ],
)
def test_a_member_is_named_by_exactly_one_valid_login_or_email(
    team: Workspace, owner: Person, body: dict[str, str]
) -> None:
    response = owner.client().post(f"{WS}/members/", body, format="json")

    assert response.status_code == 400
    assert Invitation.objects.count() == 0


def test_changing_a_role(team: Workspace, owner: Person, member: Person) -> None:
    response = owner.client().patch(f"{WS}/members/mateo/", {"role": "admin"}, format="json")

    assert response.status_code == 200
    assert response.json()["role"] == "admin"
    assert Membership.objects.get(workspace=team, user=member.user).role == Role.ADMIN


def test_the_last_admin_can_be_neither_demoted_nor_removed(team: Workspace, owner: Person) -> None:
    client = owner.client()

    demoted = client.patch(f"{WS}/members/olivia/", {"role": "member"}, format="json")
    removed = client.delete(f"{WS}/members/olivia/")

    assert demoted.status_code == removed.status_code == 400
    assert demoted.json()["message"] == "olivia is the last admin of acme: make someone else admin first."
    assert Membership.objects.get(workspace=team, user=owner.user).role == Role.ADMIN


def test_an_admin_may_step_down_when_another_admin_remains(team: Workspace, owner: Person, member: Person) -> None:
    client = owner.client()
    client.patch(f"{WS}/members/mateo/", {"role": "admin"}, format="json")

    assert client.delete(f"{WS}/members/olivia/").status_code == 204
    assert list(Membership.objects.for_workspace(team).values_list("user__username", "role")) == [("mateo", "admin")]


def test_the_owner_of_a_personal_workspace_stays_in_it(outsider: Person, member: Person) -> None:
    slug = outsider.user.personal_workspace.slug
    Membership.objects.create(workspace=outsider.user.personal_workspace, user=member.user, role=Role.ADMIN)

    response = member.client().delete(f"/api/v1/workspaces/{slug}/members/oscar/")

    assert response.status_code == 400
    assert Membership.objects.filter(workspace__slug=slug, user=outsider.user, role=Role.ADMIN).exists()


def test_removing_an_unknown_member_is_a_404(team: Workspace, owner: Person, outsider: Person) -> None:
    assert owner.client().delete(f"{WS}/members/oscar/").status_code == 404


def test_revoking_an_invitation_of_another_workspace_is_a_404(team: Workspace, owner: Person, outsider: Person) -> None:
    elsewhere = Invitation.objects.create(
        workspace=outsider.user.personal_workspace, github_login="x", role=Role.MEMBER
    )

    assert owner.client().delete(f"{WS}/invitations/{elsewhere.pk}/").status_code == 404
    assert Invitation.objects.filter(pk=elsewhere.pk).exists()


# --- API tokens -------------------------------------------------------------------


def test_a_created_token_is_shown_once_and_works_as_bearer(outsider: Person) -> None:
    response = outsider.client().post("/api/v1/tokens/", {"name": "laptop"}, format="json")

    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"id", "name", "prefix", "created_at", "last_used_at", "expires_at", "token"}
    assert body["token"].startswith(body["prefix"]) and body["prefix"].startswith("trainyard_")
    me = APIClient().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer {body['token']}")
    assert me.json()["username"] == "oscar"


def test_tokens_are_listed_by_prefix_only(outsider: Person) -> None:
    created = outsider.client().post("/api/v1/tokens/", {"name": "laptop"}, format="json").json()

    rows = outsider.client().get("/api/v1/tokens/").json()

    assert [r["name"] for r in rows] == ["laptop", "cli"]
    assert all(set(r) == {"id", "name", "prefix", "created_at", "last_used_at", "expires_at"} for r in rows)
    assert created["token"] not in str(rows)


def test_a_revoked_token_is_refused_and_no_longer_listed(outsider: Person) -> None:
    created = outsider.client().post("/api/v1/tokens/", {"name": "laptop"}, format="json").json()
    laptop = APIClient()
    laptop.credentials(HTTP_AUTHORIZATION=f"Bearer {created['token']}")

    assert outsider.client().delete(f"/api/v1/tokens/{created['id']}/").status_code == 204

    assert laptop.get("/api/v1/me/").status_code == 401
    assert [r["name"] for r in outsider.client().get("/api/v1/tokens/").json()] == ["cli"]
    assert ApiToken.objects.get(pk=created["id"]).revoked_at is not None
    assert outsider.client().delete(f"/api/v1/tokens/{created['id']}/").status_code == 404


# ------------------------------------------------------------------ invitation lifetime and visibility


def test_an_invitation_expires_after_the_configured_days_and_is_then_neither_listed_nor_taken_up(
    team: Workspace, owner: Person, settings: object
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "INVITATION_DAYS": 3}  # type: ignore[attr-defined]
    made = owner.client().post(f"{WS}/members/", {"github_login": "late", "role": "member"}, format="json").json()
    expires_at = Invitation.objects.get().expires_at
    Invitation.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    listed = owner.client().get(f"{WS}/invitations/").json()
    late = _github_user("late", 404)

    assert abs(expires_at - (timezone.now() + timedelta(days=3))) < timedelta(minutes=1)
    assert made["invitation"]["expires_at"].startswith(expires_at.strftime("%Y-%m-%dT%H:%M"))
    assert listed == []
    assert not Membership.objects.filter(workspace=team, user=late).exists()
    assert Invitation.objects.get().accepted_at is None


def test_inviting_again_renews_an_expired_invitation(team: Workspace, owner: Person) -> None:
    owner.client().post(f"{WS}/members/", {"github_login": "late", "role": "viewer"}, format="json")
    Invitation.objects.update(expires_at=timezone.now() - timedelta(days=1))

    again = owner.client().post(f"{WS}/members/", {"github_login": "late", "role": "member"}, format="json")
    late = _github_user("late", 405)

    assert again.status_code == 202
    assert Invitation.objects.count() == 1
    assert Membership.objects.get(workspace=team, user=late).role == Role.MEMBER


@pytest.mark.parametrize("who", ["member", "viewer"])
def test_only_admins_see_pending_invitations(
    team: Workspace, owner: Person, member: Person, viewer: Person, who: str
) -> None:
    owner.client().post(f"{WS}/members/", {"email": "secret.hire@example.com", "role": "admin"}, format="json")
    person = {"member": member, "viewer": viewer}[who]

    refused = person.client().get(f"{WS}/invitations/")

    assert refused.status_code == 403
    assert refused.json() == {"message": f"Your role in acme is {who}: only admins see this.", "extra": {}}
    assert b"secret.hire" not in refused.content
    assert owner.client().get(f"{WS}/invitations/").json()[0]["email"] == "secret.hire@example.com"


# ------------------------------------------------------------------ identity by GitHub id


def test_an_invitation_naming_a_github_id_is_taken_up_by_that_account_only(team: Workspace, owner: Person) -> None:
    made = owner.client().post(
        f"{WS}/members/", {"github_login": "newbie", "github_id": 303, "role": "viewer"}, format="json"
    )
    assert made.status_code == 202, made.content
    assert made.json()["invitation"]["github_id"] == 303

    recycled = _github_user("newbie", 999)  # GitHub gave the freed login to someone else
    assert not Membership.objects.filter(workspace=team, user=recycled).exists()

    renamed = _github_user("newbie-renamed", 303)  # the person invited, under a new login
    assert Membership.objects.get(workspace=team, user=renamed).role == Role.VIEWER


def test_adding_by_github_id_finds_the_account_whatever_its_login_now(team: Workspace, owner: Person) -> None:
    person = _github_user("renamed-since", 404)

    added = owner.client().post(f"{WS}/members/", {"github_login": "old-name", "github_id": 404}, format="json")

    assert added.status_code == 201, added.content
    assert Membership.objects.get(workspace=team, user=person).role == Role.MEMBER


def test_a_github_id_without_a_login_is_a_400(team: Workspace, owner: Person) -> None:
    answer = owner.client().post(f"{WS}/members/", {"email": "x@example.com", "github_id": 404}, format="json")

    assert answer.status_code == 400
    assert "github_id goes with the github_login" in answer.json()["message"]
    assert not Invitation.objects.exists()


# ------------------------------------------------------------------ workspaces per user


def test_one_account_may_make_only_so_many_workspaces(outsider: Person, settings: object) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "MAX_WORKSPACES_PER_USER": 2}  # type: ignore[attr-defined]
    client = outsider.client()
    made = [client.post("/api/v1/workspaces/", {"name": f"Team {n}"}, format="json").status_code for n in (1, 2)]

    refused = client.post("/api/v1/workspaces/", {"name": "Team 3"}, format="json")

    assert made == [201, 201]  # the personal workspace is not counted
    assert refused.status_code == 403
    assert refused.json() == {
        "message": "You have made 2 workspaces, the most one account may make on this server "
        "(TRAINYARD_MAX_WORKSPACES_PER_USER=2): work in one you are a member of, or ask the installation's "
        "admin to raise the limit.",
        "extra": {"workspaces": 2, "limit": 2},
    }
    assert not Workspace.objects.filter(name="Team 3").exists()


def test_installation_admins_are_not_capped(outsider: Person, settings: object) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "MAX_WORKSPACES_PER_USER": 1}  # type: ignore[attr-defined]
    User.objects.filter(pk=outsider.user.pk).update(is_superuser=True)

    codes = [
        outsider.client().post("/api/v1/workspaces/", {"name": f"T{n}"}, format="json").status_code for n in (1, 2)
    ]

    assert codes == [201, 201]

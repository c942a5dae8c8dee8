"""The audit log: every change to a workspace's secrets, credentials,
members, backends, tokens and runners is recorded with who, what, when and
from where, and only the workspace's admins read it."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from backend.accounts.models import AuditEvent, Workspace
from tests.support.fixtures import Person

WS = "/api/v1/workspaces/acme"
VALUE = "a-secret-value-0123"


def _events(person: Person, query: str = "") -> dict[str, Any]:
    answer = person.client().get(f"{WS}/audit/{query}", REMOTE_ADDR="203.0.113.7")
    assert answer.status_code == 200, answer.content
    body: dict[str, Any] = answer.json()
    return body


def test_secret_credential_member_token_and_runner_changes_are_recorded_with_who_and_where(
    team: Workspace, owner: Person, member: Person
) -> None:
    client = owner.client()
    calls = [
        client.put(f"{WS}/secrets/HF_TOKEN/", {"value": VALUE}, format="json", REMOTE_ADDR="198.51.100.4"),
        client.put(f"{WS}/secrets/HF_TOKEN/", {"value": VALUE + "2"}, format="json", REMOTE_ADDR="198.51.100.4"),
        client.delete(f"{WS}/secrets/HF_TOKEN/", REMOTE_ADDR="198.51.100.4"),
        client.put(
            f"{WS}/repos/credential/",
            {"url": "https://example.com/acme/models.git", "kind": "https-token", "secret": "ghp_0123456789"},
            format="json",
            REMOTE_ADDR="198.51.100.4",
        ),
        client.patch(f"{WS}/members/{member.user.username}/", {"role": "viewer"}, format="json"),
        client.post(f"{WS}/runners/registration-tokens/", {"note": "lab box"}, format="json"),
    ]
    registration = calls[-1].json()["token"]
    registered = APIClient().post(
        "/api/v1/runner/register/", {"token": registration, "name": "lab-1"}, format="json", REMOTE_ADDR="192.0.2.9"
    )

    listed = _events(owner)["results"]

    assert [c.status_code for c in calls] == [201, 200, 204, 200, 200, 201] and registered.status_code == 201
    assert [(e["action"], e["target"], e["actor"], e["username"], e["runner"]) for e in reversed(listed)] == [
        ("secret.created", "HF_TOKEN", "user", "olivia", ""),
        ("secret.replaced", "HF_TOKEN", "user", "olivia", ""),
        ("secret.deleted", "HF_TOKEN", "user", "olivia", ""),
        ("credential.set", "https://example.com/acme/models.git", "user", "olivia", ""),
        ("member.role_changed", member.user.username, "user", "olivia", ""),
        ("token.registration_created", listed[1]["target"], "user", "olivia", ""),
        ("runner.registered", "lab-1", "runner", "", "lab-1"),
    ]
    assert listed[-1]["address"] == "198.51.100.4" and listed[0]["address"] == "192.0.2.9"
    assert listed[2]["detail"] == {"role": "viewer"}
    stored = str(list(AuditEvent.objects.values()))
    assert VALUE not in stored and "ghp_0123456789" not in stored and registration not in stored


def test_only_admins_read_the_audit_log_and_another_workspace_sees_nothing(
    team: Workspace, owner: Person, member: Person, viewer: Person, outsider: Person
) -> None:
    owner.client().put(f"{WS}/secrets/HF_TOKEN/", {"value": VALUE}, format="json")
    theirs = outsider.user.personal_workspace.slug

    statuses = {
        who: p.client().get(f"{WS}/audit/").status_code
        for who, p in {"member": member, "viewer": viewer, "outsider": outsider}.items()
    }
    own = outsider.client().get(f"/api/v1/workspaces/{theirs}/audit/").json()

    assert statuses == {"member": 403, "viewer": 403, "outsider": 404}
    assert own == {"next": None, "results": []}


def test_the_log_is_paged_newest_first_and_filtered_by_kind(team: Workspace, owner: Person, member: Person) -> None:
    client = owner.client()
    for n in range(3):
        client.put(f"{WS}/secrets/S{n}/", {"value": VALUE}, format="json")
    client.patch(f"{WS}/members/{member.user.username}/", {"role": "viewer"}, format="json")

    first = _events(owner, "?kind=secret&page_size=2")
    second = owner.client().get(first["next"]).json()
    members = _events(owner, "?kind=member")["results"]
    wrong = owner.client().get(f"{WS}/audit/?kind=secrets")

    assert [e["target"] for e in first["results"]] == ["S2", "S1"]
    assert [e["target"] for e in second["results"]] == ["S0"] and second["next"] is None
    assert [e["action"] for e in members] == ["member.role_changed"]
    assert wrong.status_code == 400
    assert wrong.json()["message"] == (
        "kind 'secrets' is not an audit event kind: one of secret, credential, member, backend, token, runner, ssh_key, session, workspace, budget."
    )


def test_a_users_api_tokens_are_recorded_in_their_personal_workspace(owner: Person) -> None:
    client = owner.client()
    made = client.post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    client.delete(f"/api/v1/tokens/{made.json()['id']}/")
    personal = owner.user.personal_workspace.slug

    listed = client.get(f"/api/v1/workspaces/{personal}/audit/?kind=token").json()["results"]

    assert [(e["action"], e["username"]) for e in listed] == [
        ("token.api_revoked", "olivia"),
        ("token.api_created", "olivia"),
    ]
    assert made.json()["token"] not in str(listed)

"""A workspace's default guards through the API (docs/WORKFLOWS.md,
"Guards"; docs/API.md, "Default guards"): everyone in the workspace reads
them, its admins replace them, a bad value is refused naming its key and
changes nothing, a change is audited, another workspace's are not found,
and a run submitted after a change gets it."""

from __future__ import annotations

from typing import Any

import pytest

from backend.accounts.models import AuditEvent, Workspace
from tests.support.fixtures import Person, submit

WS = "/api/v1/workspaces/acme"
NONE = {"stall": None, "utilization_policy": None}
BOTH = {
    "stall": {"timeout": "20m", "action": "restart"},
    "utilization_policy": {"min_gpu_utilization": 10, "time_window": "30m"},
}
TRAIN = "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n"


def _put(person: Person, body: Any, slug: str = "acme") -> Any:
    return person.client().put(f"/api/v1/workspaces/{slug}/guards/", body, format="json")


def test_everyone_in_the_workspace_reads_the_defaults_and_only_admins_change_them(
    team: Workspace, owner: Person, member: Person, viewer: Person
) -> None:
    for person in (owner, member, viewer):
        answer = person.client().get(f"{WS}/guards/")
        assert (answer.status_code, answer.json()) == (200, NONE)

    refused = _put(member, BOTH)
    assert (refused.status_code, refused.json()["message"]) == (
        403,
        "Your role in acme is member: only admins can make this change.",
    )
    assert _put(viewer, BOTH).status_code == 403

    answer = _put(owner, BOTH)
    assert (answer.status_code, answer.json()) == (200, BOTH)
    assert viewer.client().get(f"{WS}/guards/").json() == BOTH
    team.refresh_from_db()
    assert team.guard_defaults == BOTH
    team.full_clean()  # what the API stored passes the Django admin's check too


def test_durations_are_shown_as_a_workflow_writes_them_and_null_or_a_left_out_key_is_no_default(
    team: Workspace, owner: Person
) -> None:
    answer = _put(
        owner, {"stall": {"timeout": "90m"}, "utilization_policy": {"min_gpu_utilization": 5, "time_window": 7200}}
    )
    assert answer.json() == {
        "stall": {"timeout": "1h30m", "action": "stop"},
        "utilization_policy": {"min_gpu_utilization": 5, "time_window": "2h"},
    }
    assert _put(
        owner, {"stall": None, "utilization_policy": {"min_gpu_utilization": 5, "time_window": "2h"}}
    ).json() == {
        "stall": None,
        "utilization_policy": {"min_gpu_utilization": 5, "time_window": "2h"},
    }
    assert _put(owner, {}).json() == NONE
    team.refresh_from_db()
    assert team.guard_defaults == {}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            {"stall": {"timeout": "soon"}},
            "stall.timeout: expected a duration such as 30m, 2h or 1d (or off), got 'soon'",
        ),
        (
            {"stall": {"timeout": "20m", "action": "kill"}},
            "stall.action: expected one of 'stop' or 'restart', got 'kill'",
        ),
        ({"stall": {"timeout": 0}}, "stall.timeout: a duration of 0 means no time at all: write e.g. 30m, or off"),
        ({"stall": {"timeout": "20m", "timout": "20m"}}, "stall.timout: unknown key 'timout'; did you mean 'timeout'?"),
        (
            {"utilization_policy": {"min_gpu_utilization": 0, "time_window": "30m"}},
            "utilization_policy.min_gpu_utilization: must be at least 1, got the number 0",
        ),
        (
            {"utilization_policy": {"min_gpu_utilization": "10%", "time_window": "30m"}},
            "utilization_policy.min_gpu_utilization: expected a whole number, got '10%'",
        ),
        (
            {"utilization_policy": {"min_gpu_utilization": 10}},
            "utilization_policy.time_window: missing required key 'time_window'",
        ),
        ({"utilisation_policy": {}}, "unknown key 'utilisation_policy'; allowed keys: utilization_policy, stall"),
        ({"stall": "20m"}, "stall: expected a mapping, got '20m'"),
        (["stall"], 'expected a mapping such as {"stall": {"timeout": "20m"}}'),
    ],
)
def test_a_bad_value_is_refused_naming_its_key_and_changes_nothing(
    team: Workspace, owner: Person, body: Any, problem: str
) -> None:
    assert _put(owner, BOTH).status_code == 200
    events = AuditEvent.objects.count()

    answer = _put(owner, body)

    assert answer.status_code == 400, answer.content
    message = answer.json()["message"]
    assert message == f"Guard defaults not changed: {problem}"
    assert answer.json()["extra"] == {"problems": [problem]}
    team.refresh_from_db()
    assert team.guard_defaults == BOTH
    assert AuditEvent.objects.count() == events


def test_a_body_of_many_bad_keys_is_refused_with_a_bounded_message(team: Workspace, owner: Person) -> None:
    answer = _put(owner, {f"key{i}": {} for i in range(1000)})
    assert answer.status_code == 400
    assert len(answer.json()["extra"]["problems"]) == 10
    assert answer.json()["message"].count("unknown key") == 10
    assert answer.json()["message"].endswith("; and 990 more")


def test_a_change_is_audited_with_the_defaults_before_and_after_and_a_same_value_is_not(
    team: Workspace, owner: Person
) -> None:
    client = owner.client()
    assert client.put(f"{WS}/guards/", BOTH, format="json", REMOTE_ADDR="198.51.100.4").status_code == 200
    assert client.put(f"{WS}/guards/", BOTH, format="json").status_code == 200  # nothing changed
    assert client.put(f"{WS}/guards/", {**BOTH, "stall": None}, format="json").status_code == 200

    listed = client.get(f"{WS}/audit/?kind=workspace").json()["results"]

    assert [(e["action"], e["target"], e["username"]) for e in listed] == [
        ("workspace.guards_set", "acme", "olivia"),
        ("workspace.guards_set", "acme", "olivia"),
    ]
    assert listed[1]["detail"] == {"before": NONE, "after": BOTH}
    assert listed[0]["detail"] == {"before": BOTH, "after": {**BOTH, "stall": None}}
    assert listed[1]["address"] == "198.51.100.4"


def test_another_workspaces_defaults_are_not_found(team: Workspace, owner: Person, outsider: Person) -> None:
    assert _put(owner, BOTH).status_code == 200
    theirs = Workspace.objects.get(personal_owner=outsider.user)

    assert outsider.client().get(f"{WS}/guards/").status_code == 404
    assert _put(outsider, NONE).status_code == 404
    assert owner.client().get(f"/api/v1/workspaces/{theirs.slug}/guards/").status_code == 404
    assert _put(owner, BOTH, slug=theirs.slug).status_code == 404
    theirs.refresh_from_db()
    team.refresh_from_db()
    assert (theirs.guard_defaults, team.guard_defaults) == ({}, BOTH)


def test_a_run_submitted_after_a_change_gets_the_defaults_and_one_submitted_before_keeps_none(
    team: Workspace, owner: Person
) -> None:
    before = submit(team, owner.user, workflow="train", text=TRAIN).jobs.get()
    assert _put(owner, BOTH).status_code == 200
    team.refresh_from_db()  # as each request reads it
    after = submit(team, owner.user, workflow="train", text=TRAIN).jobs.get()
    before.refresh_from_db()

    assert "stall" not in before.placement and "utilization_policy" not in before.placement
    assert after.placement["stall"] == {"timeout": 1200, "action": "restart"}
    assert after.placement["utilization_policy"] == {"min_gpu_utilization": 10, "time_window": 1800}

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from rest_framework.test import APIClient
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import Instance
from backend.core.errors import ApplicationError
from backend.runs.models import Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.selectors import job_log_lines
from backend.runs.services.logs import logs_store
from backend.vault.models import Secret
from backend.vault.services import secret_set
from tests.support.attempts import accept, assign_frame, report, runner_get
from tests.support.fixtures import Person, submit
from tests.support.runners import runner_instance

VALUE = "wandb-0123456789abcdef"


def test_a_secret_is_encrypted_at_rest(team: Workspace, owner: Person) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    stored = bytes(Secret.objects.get().ciphertext)
    assert VALUE.encode() not in stored and len(stored) > len(VALUE)


def test_an_invalid_name_is_refused(team: Workspace, owner: Person) -> None:
    with pytest.raises(ApplicationError, match="not a valid secret name"):
        secret_set(workspace=team, user=owner.user, name="BAD-NAME", value="x")


def test_a_value_under_4_characters_is_refused_with_the_reason(team: Workspace, owner: Person) -> None:
    with pytest.raises(ApplicationError) as refused:
        secret_set(workspace=team, user=owner.user, name="PIN", value="123")
    put = owner.client().put("/api/v1/workspaces/acme/secrets/PIN/", {"value": "abc"}, format="json")
    kept = owner.client().put("/api/v1/workspaces/acme/secrets/PIN/", {"value": "abcd"}, format="json")

    reason = (
        "A secret's value needs at least 4 characters: a shorter one cannot be masked in logs"
        " without masking ordinary text too."
    )
    assert str(refused.value) == reason
    assert (put.status_code, put.json()["message"]) == (400, reason)
    assert kept.status_code == 201 and Secret.objects.count() == 1


def test_the_api_lists_names_and_never_values(team: Workspace, owner: Person, viewer: Person) -> None:
    client = owner.client()
    put = client.put("/api/v1/workspaces/acme/secrets/WANDB_API_KEY/", {"value": VALUE}, format="json")
    listed = viewer.client().get("/api/v1/workspaces/acme/secrets/")
    denied = viewer.client().put("/api/v1/workspaces/acme/secrets/X/", {"value": "v"}, format="json")

    assert put.status_code == 201 and VALUE not in put.content.decode()
    assert [s["name"] for s in listed.json()] == ["WANDB_API_KEY"]
    assert VALUE not in listed.content.decode()
    assert denied.status_code == 403 and Secret.objects.count() == 1


RUNNER = "runner-token-of-l"


def _instance(team: Workspace, name: str = "l", token: str = RUNNER) -> Instance:
    return runner_instance(team, name, token, channel_name=f"c-{name}")


def test_secrets_reach_the_job_over_rest_not_in_the_assignment_and_are_masked(
    team: Workspace, owner: Person, run: Run
) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    instance = _instance(team)
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)

    frame = assign_frame(job)
    fetched = runner_get(job, RUNNER, "secrets")
    stored = logs_store(
        job_id=str(job.pk),
        instance_id=str(instance.pk),
        attempt=1,
        first_seq=1,
        lines=[(1.0, "o", f"key={VALUE}"), (2.0, "e", f"{VALUE}{VALUE}")],
    )

    assert frame.secrets is True and "WANDB_API_KEY" not in frame.env
    assert VALUE not in frame.model_dump_json()
    assert fetched.status_code == 200 and fetched["Cache-Control"] == "no-store"
    assert fetched.json() == {"env": {"WANDB_API_KEY": VALUE}, "credential": None}
    assert [line[2] for line in stored.new_lines] == ["key=*****", "**********"]
    assert [text for _, _, _, text in job_log_lines(job_id=str(job.pk))] == [
        "key=*****",
        "**********",
    ]


def test_another_workspace_neither_sees_nor_gets_the_secret(team: Workspace, owner: Person, outsider: Person) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    slug = outsider.user.personal_workspace.slug
    assert outsider.client().get(f"/api/v1/workspaces/{slug}/secrets/").json() == []
    assert outsider.client().get("/api/v1/workspaces/acme/secrets/").status_code == 404
    assert outsider.client().delete("/api/v1/workspaces/acme/secrets/WANDB_API_KEY/").status_code == 404
    assert Secret.objects.count() == 1


def test_only_the_runner_holding_the_current_attempt_gets_the_secrets(
    team: Workspace, owner: Person, outsider: Person, run: Run
) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    _instance(team)
    _instance(team, "other", "runner-token-of-other")
    _instance(outsider.user.personal_workspace, "theirs", "runner-token-of-theirs")
    jobs_schedule()
    job = run.jobs.get()
    holder = job.instance
    assert holder is not None and holder.name in ("l", "other")
    other = "runner-token-of-other" if holder.name == "l" else RUNNER
    holding = RUNNER if holder.name == "l" else "runner-token-of-other"

    answers = {
        "no token": APIClient().get(f"/api/v1/runner/jobs/{job.pk}/secrets/?attempt=1"),
        "unknown token": runner_get(job, "not-a-runner"),
        "another runner": runner_get(job, other),
        "another workspace's runner": runner_get(job, "runner-token-of-theirs"),
        "an old attempt": runner_get(job, holding, attempt=0),
    }
    accept(job, holder.pk)
    report(job, holder.pk, "succeeded", 0)
    answers["after the job ended"] = runner_get(job, holding)

    statuses = {why: a.status_code for why, a in answers.items()}
    assert statuses == {
        "no token": 401,
        "unknown token": 401,
        "another runner": 404,
        "another workspace's runner": 404,
        "an old attempt": 409,
        "after the job ended": 404,
    }
    assert [why for why, a in answers.items() if VALUE in a.content.decode()] == []


GOOD = "good-secret-value-1234"


def test_an_unreadable_secret_is_listed_as_such_masking_goes_on_and_jobs_are_refused_their_secrets(
    team: Workspace, owner: Person, run: Run
) -> None:
    secret_set(workspace=team, user=owner.user, name="GOOD", value=GOOD)
    secret_set(workspace=team, user=owner.user, name="BROKEN", value="was-encrypted-with-a-removed-key")
    Secret.objects.filter(workspace=team, name="BROKEN").update(ciphertext=b"gAAAAAtampered")
    instance = _instance(team)
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)

    listed = owner.client().get("/api/v1/workspaces/acme/secrets/").json()
    stored = logs_store(
        job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=1, lines=[(1.0, "o", f"k={GOOD}")]
    )
    refused = runner_get(job, RUNNER, "secrets")

    advice = (
        "secret BROKEN cannot be decrypted with the server's keys (TRAINYARD_SECRET_KEYS): the key that encrypted"
        " it was removed before `manage.py rotate_secret_keys` re-encrypted it, or the stored value was altered."
        " Set it again (`trainyard secrets set BROKEN`) or delete it (`trainyard secrets rm BROKEN`)"
    )
    assert [(s["name"], s["readable"], s["problem"]) for s in listed] == [("BROKEN", False, advice), ("GOOD", True, "")]
    assert [line[2] for line in stored.new_lines] == ["k=*****"]
    assert refused.status_code == 409
    assert refused.json() == {"message": advice, "extra": {"unreadable": ["BROKEN"]}}


def test_one_tenants_unreadable_secret_does_not_keep_another_tenants_assignment_from_going_out(
    team: Workspace, owner: Person, outsider: Person, run: Run
) -> None:
    """The assignments of a pass are sent after commit, one by one: one
    tenant's broken secret used to abort the loop for every later job."""
    theirs = outsider.user.personal_workspace
    secret_set(workspace=team, user=owner.user, name="BROKEN", value="was-encrypted-with-a-removed-key")
    Secret.objects.filter(workspace=team).update(ciphertext=b"gAAAAAtampered")
    secret_set(workspace=theirs, user=outsider.user, name="THEIRS", value=GOOD)
    later = submit(theirs, outsider.user)
    layer = get_channel_layer()
    ours_channel, theirs_channel = (async_to_sync(layer.new_channel)() for _ in range(2))
    Instance.objects.filter(pk=_instance(team).pk).update(channel_name=ours_channel)
    Instance.objects.filter(pk=_instance(theirs, "theirs", "t-token").pk).update(channel_name=theirs_channel)

    result = jobs_schedule()
    frames = {
        name: protocol.AssignJob.model_validate_json(async_to_sync(layer.receive)(channel)["frame"])
        for name, channel in (("ours", ours_channel), ("theirs", theirs_channel))
    }

    assert sorted(result.assigned) == sorted([str(run.jobs.get().pk), str(later.jobs.get().pk)])
    assert {name: (f.job, f.secrets) for name, f in frames.items()} == {
        "ours": (str(run.jobs.get().pk), True),
        "theirs": (str(later.jobs.get().pk), True),
    }
    assert GOOD not in frames["theirs"].model_dump_json()

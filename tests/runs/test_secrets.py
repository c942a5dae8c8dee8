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
from backend.vault.services import secret_env, secret_set
from tests.support.attempts import accept, assign_frame, report, runner_get
from tests.support.fixtures import Person, submit
from tests.support.runners import runner_instance

VALUE = "wandb-0123456789abcdef"
# A workflow naming the secret its job needs: a job gets only those.
NAMES_WANDB = """\
workflows:
  - name: hello
    provider: bash
    secrets: [WANDB_API_KEY]
    commands: [echo hello]
"""


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


def test_secrets_reach_the_job_over_rest_not_in_the_assignment_and_are_masked(team: Workspace, owner: Person) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    run = submit(team, owner.user, text=NAMES_WANDB)
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
    team: Workspace, owner: Person, outsider: Person
) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    run = submit(team, owner.user, text=NAMES_WANDB)
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
    team: Workspace, owner: Person
) -> None:
    secret_set(workspace=team, user=owner.user, name="GOOD", value=GOOD)
    secret_set(workspace=team, user=owner.user, name="BROKEN", value="was-encrypted-with-a-removed-key")
    Secret.objects.filter(workspace=team, name="BROKEN").update(ciphertext=b"gAAAAAtampered")
    run = submit(team, owner.user, text=NAMES_WANDB.replace("WANDB_API_KEY", "GOOD, BROKEN"))
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
    team: Workspace, owner: Person, outsider: Person
) -> None:
    """The assignments of a pass are sent after commit, one by one: one
    tenant's broken secret must not abort the loop for every later job."""
    theirs = outsider.user.personal_workspace
    secret_set(workspace=team, user=owner.user, name="BROKEN", value="was-encrypted-with-a-removed-key")
    Secret.objects.filter(workspace=team).update(ciphertext=b"gAAAAAtampered")
    secret_set(workspace=theirs, user=outsider.user, name="THEIRS", value=GOOD)
    run = submit(team, owner.user, text=NAMES_WANDB.replace("WANDB_API_KEY", "BROKEN"))
    later = submit(theirs, outsider.user, text=NAMES_WANDB.replace("WANDB_API_KEY", "THEIRS"))
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


OTHER = "hf-abcdef0123456789"
TWO_JOBS = """\
workflows:
  - name: wandb
    provider: bash
    secrets: [WANDB_API_KEY]
    commands: [echo wandb]
  - name: hub
    provider: bash
    env:
      TOKEN: ${{ secrets.HF_TOKEN }}
    commands:
      - huggingface-cli upload --token ${{ secrets.HF_TOKEN }}
  - name: plain
    provider: bash
    commands: [echo plain]
"""


@pytest.mark.parametrize(
    ("workflow", "env"),
    [
        ("wandb", {"WANDB_API_KEY": VALUE}),
        ("hub", {"TOKEN": OTHER, "HF_TOKEN": OTHER}),
        ("plain", None),
    ],
)
def test_a_job_gets_only_the_secrets_its_workflow_names(
    team: Workspace, owner: Person, workflow: str, env: dict[str, str] | None
) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    secret_set(workspace=team, user=owner.user, name="HF_TOKEN", value=OTHER)
    run = submit(team, owner.user, workflow, TWO_JOBS)
    instance = _instance(team)
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)

    frame = assign_frame(job)
    fetched = runner_get(job, RUNNER, "secrets")

    assert VALUE not in frame.model_dump_json() and OTHER not in frame.model_dump_json()
    assert frame.secrets is (env is not None)
    assert fetched.status_code == 200
    assert fetched.json() == {"env": env or {}, "credential": None}
    if workflow == "hub":
        assert frame.commands == ["huggingface-cli upload --token ${HF_TOKEN}"] and "TOKEN" not in frame.env


def test_a_secret_the_workspace_does_not_have_is_refused_at_submission_at_its_line(
    team: Workspace, owner: Person
) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    text = NAMES_WANDB.replace("[WANDB_API_KEY]", "[WANDB_API_KY]")
    answer = owner.client().post(
        "/api/v1/workspaces/acme/runs/",
        {
            "workflow": "hello",
            "workflows_files": [{"path": ".trainyard/workflows.yaml", "text": text}],
            "code": {"kind": "git", "repo_url": "https://example.com/acme/models.git", "commit": "a" * 40},
        },
        format="json",
    )

    assert answer.status_code == 400, answer.content
    assert answer.json()["extra"]["errors"] == [
        {
            "file": ".trainyard/workflows.yaml",
            "line": 4,
            "key": "workflows[0] (hello).secrets[0]",
            "message": "secret 'WANDB_API_KY' is not set in this workspace; did you mean 'WANDB_API_KEY'?"
            " a workspace admin sets it with `trainyard secrets set WANDB_API_KY`",
        }
    ]
    assert Run.objects.count() == 0


def test_a_secret_deleted_after_submission_fails_the_job_naming_it(team: Workspace, owner: Person) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    run = submit(team, owner.user, text=NAMES_WANDB)
    owner.client().delete("/api/v1/workspaces/acme/secrets/WANDB_API_KEY/")
    instance = _instance(team)
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)

    refused = runner_get(job, RUNNER, "secrets")

    assert refused.status_code == 409
    assert refused.json()["message"] == (
        "secret WANDB_API_KEY named by workflow hello is not set in the workspace any more: an admin sets it"
        " again (`trainyard secrets set WANDB_API_KEY`)"
    )


def test_a_member_cannot_write_a_secret_and_reads_only_names(team: Workspace, owner: Person, member: Person) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    client = member.client()

    put = client.put("/api/v1/workspaces/acme/secrets/WANDB_API_KEY/", {"value": "replaced-by-a-member"}, format="json")
    new = client.put("/api/v1/workspaces/acme/secrets/NEW/", {"value": "set-by-a-member"}, format="json")
    deleted = client.delete("/api/v1/workspaces/acme/secrets/WANDB_API_KEY/")
    listed = client.get("/api/v1/workspaces/acme/secrets/")

    denial = "Your role in acme is member: only admins can make this change."
    assert [(a.status_code, a.json()["message"]) for a in (put, new, deleted)] == [(403, denial)] * 3
    assert [s["name"] for s in listed.json()] == ["WANDB_API_KEY"] and VALUE not in listed.content.decode()
    assert list(Secret.objects.values_list("name", flat=True)) == ["WANDB_API_KEY"]
    assert secret_env(workspace_id=team.pk).env == {"WANDB_API_KEY": VALUE}

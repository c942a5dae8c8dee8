from __future__ import annotations

import pytest

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.core.errors import ApplicationError
from backend.runs.models import LogLine, Run
from backend.runs.services.logs import logs_store
from backend.runs.services.scheduling import jobs_schedule
from backend.vault.models import Secret
from backend.vault.services import secret_set
from tests.support.attempts import accept, assign_frame
from tests.support.fixtures import Person

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


def test_secrets_reach_the_job_env_and_are_masked_in_stored_logs(team: Workspace, owner: Person, run: Run) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    instance = Instance.objects.create(
        workspace=team,
        backend="local",
        name="l",
        token_hash="s" * 64,
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**30,
        channel_name="c",
    )
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)

    frame = assign_frame(job)
    stored = logs_store(
        job_id=str(job.pk),
        instance_id=str(instance.pk),
        attempt=1,
        first_seq=1,
        lines=[(1.0, "o", f"key={VALUE}"), (2.0, "e", f"{VALUE}{VALUE}")],
    )

    assert frame.env["WANDB_API_KEY"] == VALUE
    assert [line[2] for line in stored.new_lines] == ["key=*****", "**********"]
    assert list(LogLine.objects.filter(job_id=job.pk).order_by("seq").values_list("text", flat=True)) == [
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

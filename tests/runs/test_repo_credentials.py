"""A private repo's clone credential: set through the API, encrypted at rest,
never returned, fetched by the job's runner over REST (never in the
assignment), masked in logs and reasons, invisible to another workspace."""

from __future__ import annotations

import base64

import pytest

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.core.tokens import hash_token
from backend.repos.models import Repo
from backend.runs.lifecycle.redaction import job_reason_clean
from backend.runs.models import Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.logs import logs_store
from backend.vault.models import RepoCredential
from tests.support.attempts import accept, assign_frame, runner_get
from tests.support.fixtures import Person

URL = "https://example.com/acme/models.git"  # the fixtures' run comes from this remote
CRED = "/api/v1/workspaces/acme/repos/credential/"
TOKEN = "glpat-privateRepoToken42"
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAAB\n-----END OPENSSH PRIVATE KEY-----\n"


def _set(person: Person, **body: str) -> object:
    return person.client().put(CRED, {"url": URL, "kind": "https-token", "secret": TOKEN, **body}, format="json")


def test_a_token_is_stored_encrypted_and_never_returned(team: Workspace, owner: Person, run: Run) -> None:
    answer = _set(owner, username="ci-bot")
    repos = owner.client().get("/api/v1/workspaces/acme/repos/")

    assert answer.status_code == 200 and set(answer.json()) == {"set", "kind", "set_at"}
    assert answer.json()["kind"] == "https-token"
    assert repos.json()[0]["credential"]["kind"] == "https-token"
    for body in (answer.content, repos.content):
        assert TOKEN.encode() not in body and base64.b64encode(f"ci-bot:{TOKEN}".encode()) not in body
    assert TOKEN.encode() not in bytes(RepoCredential.objects.get().ciphertext)


def test_the_runner_fetches_the_credential_not_in_the_assignment_and_logs_and_reasons_mask_it(
    team: Workspace, owner: Person, run: Run
) -> None:
    _set(owner, username="ci-bot")
    instance = Instance.objects.create(
        workspace=team, backend="local", name="l", token_hash=hash_token("rt"), status=InstanceStatus.IDLE,
        cpus=2, memory_bytes=2**30, channel_name="c",
    )  # fmt: skip
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)
    basic = base64.b64encode(f"ci-bot:{TOKEN}".encode()).decode()

    frame = assign_frame(job)
    stored = logs_store(
        job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=1,
        lines=[(1.0, "o", f"token={TOKEN}"), (2.0, "e", f"Authorization: Basic {basic}")],
    )  # fmt: skip

    fetched = runner_get(job, "rt", "secrets")

    assert frame.secrets is True and frame.code.credential is None
    assert TOKEN not in frame.model_dump_json()
    assert fetched.json() == {"env": {}, "credential": {"kind": "https-token", "username": "ci-bot", "secret": TOKEN}}
    assert [line[2] for line in stored.new_lines] == ["token=*****", "Authorization: Basic *****"]
    assert TOKEN not in job_reason_clean(job_id=job.pk, reason=f"clone failed: {TOKEN} / {basic}")


def test_an_ssh_key_is_for_ssh_remotes_and_must_be_a_private_key(team: Workspace, owner: Person) -> None:
    ssh_url = "git@example.com:acme/models.git"
    wrong_remote = owner.client().put(CRED, {"url": URL, "kind": "ssh-key", "secret": KEY}, format="json")
    public = owner.client().put(
        CRED, {"url": ssh_url, "kind": "ssh-key", "secret": "ssh-ed25519 AAAAC3Nza me@box"}, format="json"
    )
    ok = owner.client().put(CRED, {"url": ssh_url, "kind": "ssh-key", "secret": KEY}, format="json")
    token_on_ssh = owner.client().put(CRED, {"url": ssh_url, "kind": "https-token", "secret": TOKEN}, format="json")

    assert wrong_remote.status_code == 400 and "is not an SSH remote" in wrong_remote.json()["message"]
    assert public.status_code == 400 and public.json()["message"].startswith("That is a public key")
    assert ok.status_code == 200 and ok.json()["kind"] == "ssh-key"
    assert token_on_ssh.status_code == 400 and "is not an http(s):// URL" in token_on_ssh.json()["message"]
    assert Repo.objects.get(url=ssh_url).credential.kind == "ssh-key"


@pytest.mark.parametrize("method", ["put", "delete"])
def test_another_workspace_cannot_set_read_or_remove_the_credential(
    team: Workspace, owner: Person, outsider: Person, viewer: Person, method: str
) -> None:
    _set(owner)
    before = bytes(RepoCredential.objects.get().ciphertext)
    theirs = outsider.user.personal_workspace.slug

    if method == "put":
        assert _set(outsider, secret="stolen-token-1234").status_code == 404
        assert _set(viewer, secret="viewer-token-1234").status_code == 403
    else:
        assert outsider.client().delete(f"{CRED}?url={URL}").status_code == 404
        assert outsider.client().delete(f"/api/v1/workspaces/{theirs}/repos/credential/?url={URL}").status_code == 404
    assert outsider.client().get("/api/v1/workspaces/acme/repos/").status_code == 404
    assert outsider.client().get(f"/api/v1/workspaces/{theirs}/repos/").json() == []
    assert bytes(RepoCredential.objects.get().ciphertext) == before


def test_removing_the_credential_leaves_the_assignment_without_one(team: Workspace, owner: Person, run: Run) -> None:
    _set(owner)
    assert owner.client().delete(f"{CRED}?url={URL}").status_code == 204
    assert owner.client().delete(f"{CRED}?url={URL}").status_code == 404
    assert owner.client().get("/api/v1/workspaces/acme/repos/").json()[0]["credential"] is None

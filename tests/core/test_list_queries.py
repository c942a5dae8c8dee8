"""Every list endpoint answers in a constant number of queries: the same
bound holds for 3 rows and for 40, so a query per row (an N+1) breaks it.
The runs list and the run page have their own tests (tests/runs/test_runs_list.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backend.accounts.models import Membership, Role, Workspace
from backend.accounts.services import api_token_create, user_get_or_create
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete
from backend.artifacts.storage import get_storage
from backend.clouds.models import CloudAccount, Instance, InstanceStatus
from backend.clouds.services.selfhosted import registration_token_create, runner_register
from backend.repos.models import Repo
from backend.runs.models import Run, RunStatus
from backend.runs.services.tags import tag_set
from backend.vault.services import secret_set
from tests.support.fixtures import Person, submit

WS = "/api/v1/workspaces/acme"


def _tags(team: Workspace, owner: Person, n: int) -> None:
    for i in range(n):
        run = submit(team, owner.user)
        Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
        run.status = RunStatus.SUCCEEDED
        tag_set(workspace=team, user=owner.user, name=f"tag{i}", run=run, force=False)


def _artifacts(team: Workspace, owner: Person, n: int) -> None:
    job = Run.objects.get(workspace=team, name="listed").jobs.get()
    for i in range(n):
        files = {f"f{k}.bin": f"{i}-{k}".encode() for k in range(3)}
        manifest = [FileIn(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]
        row, _ = artifact_begin(job=job, path=f"./out{i}", files=manifest)
        for p, d in files.items():
            get_storage().write(f"{row.storage_prefix}/{p}", iter([d]))
        artifact_complete(artifact=row)


def _instances(team: Workspace, owner: Person, n: int) -> None:
    account = CloudAccount.objects.create(workspace=team, kind="aws", name="aws", config={"regions": ["us-east-1"]})
    for i in range(n):
        instance = Instance.objects.create(
            workspace=team, account=account, backend="aws", name=f"aws-{i:04x}", token_hash=f"t{i}",
            status=InstanceStatus.IDLE,
        )  # fmt: skip
        job = submit(team, owner.user).jobs.get()
        job.instance = instance
        job.status = "running"
        job.save(update_fields=["instance", "status"])


def _members(team: Workspace, owner: Person, n: int) -> None:
    for i in range(n):
        Membership.objects.create(workspace=team, user=user_get_or_create(username=f"m{i}"), role=Role.MEMBER)


def _tokens(team: Workspace, owner: Person, n: int) -> None:
    for _ in range(n):
        api_token_create(user=owner.user)


def _secrets(team: Workspace, owner: Person, n: int) -> None:
    for i in range(n):
        secret_set(workspace=team, user=owner.user, name=f"S{i}", value=f"value-{i}")


def _repos(team: Workspace, owner: Person, n: int) -> None:
    for i in range(n):
        repo = Repo.objects.create(workspace=team, url=f"https://example.com/acme/r{i}.git", name=f"r{i}")
        Run.objects.filter(pk=submit(team, owner.user).pk).update(repo=repo)


def _registration_tokens(team: Workspace, owner: Person, n: int) -> None:
    for i in range(n):
        issued = registration_token_create(workspace=team, user=owner.user, note=f"box {i}")
        if i % 2:
            runner_register(token=issued.token, name=f"box-{i}")


def _runners(team: Workspace, owner: Person, n: int) -> None:
    for i in range(n):
        runner_register(token=registration_token_create(workspace=team, user=owner.user).token, name=f"box-{i}")


def _backends(team: Workspace, owner: Person, n: int) -> None:
    for i in range(n):
        account = CloudAccount.objects.create(
            workspace=team, kind="aws", name=f"aws{i}", config={"regions": ["us-east-1"]}
        )
        Instance.objects.create(workspace=team, account=account, backend="aws", name=f"aws-{i}", token_hash=f"b{i}")


def _workspaces(team: Workspace, owner: Person, n: int) -> None:
    for i in range(n):
        other = Workspace.objects.create(slug=f"team-{i}", name=f"Team {i}")
        Membership.objects.create(workspace=other, user=owner.user, role=Role.MEMBER)


def _invitations(team: Workspace, owner: Person, n: int) -> None:
    from backend.accounts.services.workspaces import member_add

    for i in range(n):
        member_add(workspace=team, invited_by=owner.user, github_login=f"invitee{i}", role=Role.MEMBER)


# name: (path, make n rows, queries at most)
CASES: dict[str, tuple[str, Callable[[Workspace, Person, int], None], int]] = {
    "tags": (f"{WS}/tags/", _tags, 4),
    "artifacts": (f"{WS}/runs/listed/artifacts/", _artifacts, 7),  # and one for the run's copies to to: places
    "instances": (f"{WS}/instances/", _instances, 5),
    "members": (f"{WS}/members/", _members, 4),
    "tokens": ("/api/v1/tokens/", _tokens, 3),
    "secrets": (f"{WS}/secrets/", _secrets, 4),
    "repos": (f"{WS}/repos/", _repos, 5),
    "registration tokens": (f"{WS}/runners/registration-tokens/", _registration_tokens, 4),
    "runners": (f"{WS}/runners/", _runners, 4),
    "backends": (f"{WS}/backends/", _backends, 5),
    "workspaces": ("/api/v1/workspaces/", _workspaces, 3),
    "invitations": (f"{WS}/invitations/", _invitations, 4),
}


@pytest.mark.parametrize("rows", [3, 40])
@pytest.mark.parametrize("case", list(CASES))
def test_every_list_answers_in_the_same_few_queries_for_3_and_for_40_rows(
    case: str,
    rows: int,
    team: Workspace,
    owner: Person,
    settings: Any,
    tmp_path: Path,
    django_assert_max_num_queries: Any,
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    path, make, bound = CASES[case]
    listed = submit(team, owner.user)
    Run.objects.filter(pk=listed.pk).update(name="listed")
    make(team, owner, rows)
    client = owner.client()

    with django_assert_max_num_queries(bound):
        response = client.get(path)

    assert response.status_code == 200, response.content
    body = response.json()
    items = body["results"] if isinstance(body, dict) and "results" in body else body
    assert len(items) >= rows

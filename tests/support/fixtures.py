"""People and runs for tenant tests: owner, member, viewer, outsider.

Import into a test folder's conftest with ``from tests.support.fixtures import *``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from backend.accounts.models import Membership, Role, User, Workspace
from backend.accounts.services import api_token_create, user_get_or_create
from backend.runs.models import Run
from backend.runs.services.runs import CodeInput, run_create

WORKFLOWS = """\
workflows:
  - name: hello
    provider: bash
    commands:
      - echo hello
    artifacts:
      - ./out
  - name: big
    provider: bash
    commands: [echo big]
    resources:
      gpu: {name: V100, count: 1}
  - name: train
    provider: bash
    commands: [cat out/w.bin]
    deps:
      - workflow: hello
    artifacts: [./model]
  - name: evaluate
    provider: bash
    commands: [cat model/m.bin]
    deps:
      - tag: best
"""


@dataclass
class Person:
    user: User
    token: str

    def client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        return client


def _person(username: str) -> Person:
    user = user_get_or_create(username=username)
    return Person(user=user, token=api_token_create(user=user))


@pytest.fixture
def team(db: None) -> Workspace:
    return Workspace.objects.create(slug="acme", name="Acme")


def _member(team: Workspace, username: str, role: Role) -> Person:
    person = _person(username)
    Membership.objects.create(workspace=team, user=person.user, role=role)
    return person


@pytest.fixture
def owner(team: Workspace) -> Person:
    return _member(team, "olivia", Role.ADMIN)


@pytest.fixture
def member(team: Workspace) -> Person:
    return _member(team, "mateo", Role.MEMBER)


@pytest.fixture
def viewer(team: Workspace) -> Person:
    return _member(team, "vera", Role.VIEWER)


@pytest.fixture
def outsider(db: None) -> Person:
    return _person("oscar")


def submit(
    workspace: Workspace,
    user: User,
    workflow: str = "hello",
    text: str = WORKFLOWS,
    *,
    no_cache: bool = False,
    commit: str = "a" * 40,
) -> Run:
    return run_create(
        workspace=workspace,
        user=user,
        workflow=workflow,
        workflows_file_path=".trainyard/workflows.yaml",
        workflows_file_text=text,
        code=CodeInput(kind="git", repo_url="https://example.com/acme/models.git", commit=commit),
        env={},
        no_cache=no_cache,
    )


@pytest.fixture
def run(team: Workspace, owner: Person) -> Run:
    return submit(team, owner.user)

"""A submission sent again with its ``Idempotency-Key`` makes no second run
(backend/runs/services/submissions.py): the retry is answered with the first
run, another body under the same key is refused, and two copies sent at the
same moment make one run. Real Postgres, through the REST API."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import connection
from django.utils import timezone
from trainyard import api

from backend.accounts.models import Workspace
from backend.runs import tasks
from backend.runs.models import Run, SubmissionKey
from tests.support.fixtures import WORKFLOWS, Person
from tests.support.web import WebServers

BASE = "/api/v1/workspaces/acme"


def _body(commit: str = "b" * 40) -> dict[str, Any]:
    return {
        "workflow": "hello",
        "workflows_file": {"path": ".trainyard/workflows.yaml", "text": WORKFLOWS},
        "code": {"kind": "git", "repo_url": "https://example.com/acme/models.git", "commit": commit},
    }


def _post(person: Person, body: dict[str, Any], key: str | None) -> Any:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return person.client().post(f"{BASE}/runs/", body, format="json", **headers)


@pytest.mark.django_db
def test_the_same_submission_sent_twice_with_one_key_makes_one_run(team: Workspace, member: Person) -> None:
    first = _post(member, _body(), "2f0c1c9e-retry-me")
    again = _post(member, _body(), "2f0c1c9e-retry-me")

    assert first.status_code == again.status_code == 201, again.content
    assert again.json()["name"] == first.json()["name"]
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert Run.objects.for_workspace(team).count() == 1


@pytest.mark.django_db
def test_without_a_key_each_submission_makes_its_own_run(team: Workspace, member: Person) -> None:
    assert _post(member, _body(), None).status_code == 201
    assert _post(member, _body(), None).status_code == 201
    assert Run.objects.for_workspace(team).count() == 2


@pytest.mark.django_db
def test_one_key_with_another_submission_is_refused_and_names_the_first_run(team: Workspace, member: Person) -> None:
    first = _post(member, _body("b" * 40), "k-1")
    other = _post(member, _body("c" * 40), "k-1")

    assert other.status_code == 422, other.content
    message = other.json()["message"]
    assert "Idempotency-Key 'k-1' was sent with another submission" in message
    assert first.json()["name"] in message
    assert "send a new key" in message
    assert Run.objects.for_workspace(team).count() == 1


@pytest.mark.django_db
def test_a_key_is_one_persons_own(team: Workspace, member: Person, owner: Person) -> None:
    mine = _post(member, _body(), "shared-key")
    theirs = _post(owner, _body(), "shared-key")

    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["name"] != theirs.json()["name"]
    assert "Idempotent-Replayed" not in theirs.headers


@pytest.mark.django_db
def test_a_key_past_its_window_makes_a_new_run(team: Workspace, member: Person) -> None:
    first = _post(member, _body(), "old-key")
    SubmissionKey.objects.filter(key="old-key").update(created_at=timezone.now() - timedelta(hours=25))

    again = _post(member, _body(), "old-key")

    assert again.status_code == 201
    assert again.json()["name"] != first.json()["name"]
    assert SubmissionKey.objects.filter(key="old-key").count() == 1


@pytest.mark.django_db
def test_keys_past_their_window_are_forgotten_by_the_hourly_task(team: Workspace, member: Person) -> None:
    _post(member, _body("b" * 40), "old")
    _post(member, _body("c" * 40), "new")
    SubmissionKey.objects.filter(key="old").update(created_at=timezone.now() - timedelta(hours=25))

    assert tasks.submission_keys_expire() == 1

    assert list(SubmissionKey.objects.values_list("key", flat=True)) == ["new"]
    assert Run.objects.for_workspace(team).count() == 2  # the runs stay


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "has space", "x" * 256, "caf\u00e9"])
def test_a_malformed_key_is_refused_with_what_a_key_may_be(team: Workspace, member: Person, key: str) -> None:
    answer = _post(member, _body(), key)

    assert answer.status_code == 400, answer.content
    assert answer.json()["message"].startswith("Idempotency-Key must be 1 to 255 printable ASCII characters")
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_copies_sent_at_once_make_one_run(team: Workspace, member: Person) -> None:
    start = threading.Barrier(4)
    answers: list[Any] = []

    def send() -> None:
        try:
            start.wait()
            answers.append(_post(member, _body(), "at-once"))
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert [a.status_code for a in answers] == [201] * 4, [a.content for a in answers]
    assert len({a.json()["name"] for a in answers}) == 1
    assert sum(a.headers.get("Idempotent-Replayed") == "true" for a in answers) == 3
    assert Run.objects.for_workspace(team).count() == 1


class AnswerLost(httpx.BaseTransport):
    """Delivers every request to the real server; the first submission's
    answer is dropped on its way back, as a timeout would drop it."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.submissions: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/runs/"):
            self.submissions.append(request)
            if len(self.submissions) == 1:
                response.read()
                raise httpx.ReadTimeout("the answer was lost", request=request)
        return response


def test_the_cli_retries_a_submission_whose_answer_was_lost_and_makes_one_run(
    team: Workspace, member: Person, web_server: WebServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api, "RETRY_WAITS", (0.0, 0.0))
    server = web_server.start()
    transport = AnswerLost()
    body = _body()
    with api.Client(server.url, member.token, "acme", transport=transport) as client:
        run = client.create_run(code=body["code"], workflow="hello", workflows_files=[body["workflows_file"]])

    keys = [r.headers["Idempotency-Key"] for r in transport.submissions]
    assert len(keys) == 2 and keys[0] == keys[1], keys
    assert [r.name for r in Run.objects.for_workspace(team)] == [run["name"]]

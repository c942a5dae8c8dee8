"""Text no client means is refused with a 400 in the one error format, never a 500."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from backend.config.asgi import application
from backend.runs.models import Run
from tests.support.fixtures import WORKFLOWS, Person

BASE = "/api/v1/workspaces/acme"
CODE = {"kind": "git", "repo_url": "https://example.com/acme/models.git", "commit": "c" * 40}


@pytest.mark.parametrize("query", ["tag=a%00b", "status=%00", "workflow=x%19y", "page=1%00", "a%00=1"])
def test_a_control_character_in_a_query_parameter_is_a_400(owner: Person, query: str) -> None:
    response = owner.client().get(f"{BASE}/runs/?{query}")

    assert response.status_code == 400
    assert "contains a control character (U+00" in response.json()["message"]
    assert set(response.json()) == {"message", "extra"}


def test_a_nul_in_the_path_is_a_400_and_no_lookup(owner: Person) -> None:
    response = owner.client().get(f"{BASE}/runs/a%00b/")

    assert response.status_code == 400
    assert response.json() == {"message": "The URL path contains a control character (U+0000).", "extra": {}}


@pytest.mark.parametrize(
    ("field", "where"),
    [
        ({"env": {"A\x00": "1"}}, "env.A\\0"),
        ({"env": {"A": "1\x00"}}, "env.A"),
        ({"run_args": ["ok", "x\x00"]}, "run_args[1]"),
    ],
)
def test_a_nul_in_a_json_body_is_a_400_naming_where(owner: Person, field: dict[str, object], where: str) -> None:
    body = {"workflow": "hello", "workflows_file": {"path": "w.yaml", "text": WORKFLOWS}, "code": CODE, **field}

    response = owner.client().post(f"{BASE}/runs/", body, format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["message"] == f"The JSON body contains a NUL character (U+0000) at {where}."
    assert not Run.objects.exists()


def test_a_character_yaml_refuses_is_a_400_with_the_file_and_line(owner: Person) -> None:
    text = "workflows:\n  - name: hello\n    provider: bash\n    commands: [echo \x19]\n"
    body = {"workflow": "hello", "workflows_file": {"path": ".trainyard/w.yaml", "text": text}, "code": CODE}

    response = owner.client().post(f"{BASE}/runs/", body, format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["message"].startswith(".trainyard/w.yaml:4: yaml: invalid YAML: character #x0019")
    assert response.json()["extra"]["errors"][0]["line"] == 4
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_nul_in_a_websocket_path_closes_it_as_not_found(owner: Person) -> None:
    async def close_code() -> int:
        headers = [(b"authorization", f"Bearer {owner.token}".encode())]
        ws = WebsocketCommunicator(application, "/ws/v1/workspaces/acme/runs/a\x00b/", headers=headers)
        connected, code = await ws.connect(timeout=5)
        if not connected:
            return int(code or 0)
        message = await ws.receive_output(timeout=5)
        return int(message.get("code", 0))

    assert async_to_sync(close_code)() == 4404

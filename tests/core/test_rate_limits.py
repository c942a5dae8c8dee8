"""Rate limits: every throttled endpoint answers 429 with Retry-After past its
limit, per user and per address; websocket connects close 4429; the counters
are Redis's, so another process's hits count too."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client
from rest_framework.test import APIClient
from trainyard_runner import protocol

from backend.accounts.models import Membership, Role, Workspace
from backend.accounts.services import api_token_create, hash_token, user_get_or_create
from backend.clouds.models import Instance, InstanceStatus
from backend.config.asgi import application
from backend.runs.models import Run
from tests.support.fixtures import WORKFLOWS, Person, submit

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE = "/api/v1/workspaces/acme"
RUN_BODY = {
    "workflow": "hello",
    "workflows_file": {"path": ".trainyard/workflows.yaml", "text": WORKFLOWS},
    "code": {"kind": "git", "repo_url": "https://example.com/r.git", "commit": "b" * 40},
}


@pytest.fixture
def limits(settings: Any) -> Callable[..., str]:
    """``limits(scope, user=…, ip=…)``: only this scope's limits, as (hits, seconds);
    fresh counters (a key prefix of this test's own). Returns the prefix."""
    prefix = f"test-{secrets.token_hex(4)}"

    def set_limits(scope: str, *, user: tuple[int, int] | None = None, ip: tuple[int, int] | None = None) -> str:
        settings.TRAINYARD = {
            **settings.TRAINYARD,
            "RATE_LIMITS": {scope: {"user": user, "ip": ip}},
            "RATE_LIMIT_PREFIX": f"{prefix}:ratelimit",
        }
        return prefix

    return set_limits


def _client(person: Person | None, ip: str) -> APIClient:
    client = APIClient(REMOTE_ADDR=ip)
    if person is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {person.token}")
    return client


def _person(team: Workspace, username: str) -> Person:
    user = user_get_or_create(username=username)
    Membership.objects.create(workspace=team, user=user, role=Role.MEMBER)
    return Person(user=user, token=api_token_create(user=user))


Call = Callable[[Person, str], Any]


def _login(person: Person, ip: str) -> Any:
    body = {"username": person.user.username, "password": "wrong"}
    return _client(None, ip).post("/api/v1/auth/login/", body, format="json")


def _token(person: Person, ip: str) -> Any:
    return _client(person, ip).post("/api/v1/tokens/", {"name": "ci"}, format="json")


def _run(person: Person, ip: str) -> Any:
    return _client(person, ip).post(f"{BASE}/runs/", RUN_BODY, format="json")


def _rerun(person: Person, ip: str) -> Any:
    run = Run.objects.order_by("created_at").first()
    assert run is not None
    return _client(person, ip).post(f"{BASE}/runs/{run.name}/rerun/")


def _blob(person: Person, ip: str) -> Any:
    return _client(person, ip).post(f"{BASE}/blobs/", b"code bytes", content_type="application/octet-stream")


def _plan(person: Person, ip: str) -> Any:
    return _client(person, ip).post(f"{BASE}/runs/plan/", RUN_BODY, format="json")


ENDPOINTS: dict[str, tuple[str, Call]] = {
    "login": ("login", _login),
    "token": ("token", _token),
    "run": ("run", _run),
    "rerun": ("run", _rerun),
    "blob": ("blob", _blob),
    "plan": ("plan", _plan),
}


@pytest.fixture
def people(team: Workspace, settings: Any, tmp_path: Path) -> list[Person]:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    found = [_person(team, name) for name in ("ana", "ben", "cy")]
    submit(team, found[0].user)  # for the re-run
    return found


def _assert_limited(response: Any, scope: str, per: str, limit: int) -> None:
    assert response.status_code == 429, response.content
    body = response.json()
    retry = int(response["Retry-After"])
    assert 1 <= retry <= 60
    assert body["extra"] == {
        "scope": scope,
        "per": per,
        "limit": limit,
        "period_seconds": 60,
        "retry_after_seconds": retry,
    }
    who = "this account" if per == "user" else "this address"
    assert body["message"].endswith(f"from {who}: at most {limit} per minute. Try again in {retry} s.")


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_past_its_limit_per_user_an_endpoint_answers_429_with_retry_after(
    endpoint: str, people: list[Person], limits: Callable[..., str]
) -> None:
    scope, call = ENDPOINTS[endpoint]
    limits(scope, user=(2, 60))
    ana, ben, _ = people

    first = [call(ana, f"10.0.0.{i}").status_code for i in (1, 2)]  # another address each time: still ana
    over = call(ana, "10.0.0.3")
    other_user = call(ben, "10.0.0.3")

    assert 429 not in first
    _assert_limited(over, scope, "user", 2)
    assert other_user.status_code != 429


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_past_its_limit_per_address_an_endpoint_answers_429_with_retry_after(
    endpoint: str, people: list[Person], limits: Callable[..., str]
) -> None:
    scope, call = ENDPOINTS[endpoint]
    limits(scope, ip=(2, 60))
    ana, ben, cy = people

    first = [call(ana, "10.0.0.9").status_code, call(ben, "10.0.0.9").status_code]
    over = call(cy, "10.0.0.9")
    other_address = call(cy, "10.0.0.10")

    assert 429 not in first
    _assert_limited(over, scope, "ip", 2)
    assert other_address.status_code != 429


def test_the_github_sign_in_start_is_limited_per_address(db: None, limits: Callable[..., str]) -> None:
    limits("login", ip=(2, 60))

    first = [Client(REMOTE_ADDR="10.0.1.1").post("/auth/login/github/").status_code for _ in range(2)]
    over = Client(REMOTE_ADDR="10.0.1.1").post("/auth/login/github/")
    elsewhere = Client(REMOTE_ADDR="10.0.1.2").post("/auth/login/github/")

    assert 429 not in first
    _assert_limited(over, "login", "ip", 2)
    assert elsewhere.status_code != 429


def test_reads_are_not_counted(people: list[Person], limits: Callable[..., str]) -> None:
    limits("run", user=(1, 60), ip=(1, 60))
    ana = people[0]

    reads = [_client(ana, "10.0.0.1").get(f"{BASE}/runs/").status_code for _ in range(5)]

    assert reads == [200] * 5
    assert _run(ana, "10.0.0.1").status_code == 201


def test_counters_are_shared_across_processes(db: None, limits: Callable[..., str]) -> None:
    """Another process (another web worker) spends the address's login budget: this one refuses."""
    prefix = limits("login", ip=(3, 60))
    env = {**os.environ, "TRAINYARD_CHANNEL_PREFIX": prefix, "TRAINYARD_RATE_LOGIN_IP": "3/min"}
    script = (
        "import django; django.setup()\n"
        "from django.test import Client\n"
        "codes = [Client(REMOTE_ADDR='10.0.2.1').post('/api/v1/auth/login/', {}).status_code for _ in range(3)]\n"
        "print(codes)\n"
    )

    other = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    here = Client(REMOTE_ADDR="10.0.2.1").post("/api/v1/auth/login/", {"username": "x", "password": "y"})

    assert other.stdout.strip() == "[400, 400, 400]", other.stderr
    _assert_limited(here, "login", "ip", 3)


# ------------------------------------------------------------------ websockets


def _ws(path: str, token: str | None, ip: str) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    communicator = WebsocketCommunicator(application, path, headers=headers)
    communicator.scope["client"] = (ip, 40000)
    return communicator


async def _close_of(ws: WebsocketCommunicator) -> dict[str, Any]:
    """The close frame, or ``{"code": None}`` for a socket left open (a frame
    came, or a runner's socket stayed quiet waiting for its hello)."""
    connected, _ = await ws.connect()
    assert connected
    try:
        message = await ws.receive_output(timeout=1)
    except TimeoutError:  # the communicator cancelled the consumer already
        return {"code": None}
    if message["type"] == "websocket.close":
        await ws.wait()
        return dict(message)
    await ws.disconnect()
    return {"code": None}


def _closes(connects: list[tuple[str, str | None, str]]) -> list[int | None]:
    from asgiref.sync import async_to_sync

    async def scenario() -> list[int | None]:
        return [(await _close_of(_ws(path, token, ip))).get("code") for path, token, ip in connects]

    return async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_browser_websocket_connects_close_4429_past_the_limit_per_user(
    team: Workspace, owner: Person, member: Person, limits: Callable[..., str]
) -> None:
    limits("ws", user=(2, 60))
    path = f"/ws/v1/workspaces/{team.slug}/runs/"

    codes = _closes([(path, owner.token, "10.0.3.1"), (path, owner.token, "10.0.3.2"), (path, owner.token, "10.0.3.3")])
    other = _closes([(path, member.token, "10.0.3.3")])

    assert codes == [None, None, protocol.CLOSE_RATE_LIMITED]
    assert other == [None]


@pytest.mark.django_db(transaction=True)
def test_browser_websocket_connects_close_4429_past_the_limit_per_address(
    team: Workspace, owner: Person, member: Person, limits: Callable[..., str]
) -> None:
    limits("ws", ip=(2, 60))
    path = f"/ws/v1/workspaces/{team.slug}/runs/"

    codes = _closes([(path, owner.token, "10.0.4.1"), (path, member.token, "10.0.4.1"), (path, None, "10.0.4.1")])
    elsewhere = _closes([(path, owner.token, "10.0.4.2")])

    assert codes == [None, None, protocol.CLOSE_RATE_LIMITED]
    assert elsewhere == [None]


def _instance(team: Workspace, token: str) -> Instance:
    return Instance.objects.create(
        workspace=team, backend="local", name=f"local-{token}", token_hash=hash_token(token),
        status=InstanceStatus.PROVISIONING,
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_a_runner_fleet_behind_one_address_is_limited_per_runner_not_per_address(
    team: Workspace, limits: Callable[..., str]
) -> None:
    limits("runner", user=(2, 60), ip=(2, 60))
    for n in range(4):
        _instance(team, f"fleet-{n}")
    nat = "10.0.5.1"

    fleet = _closes([("/ws/runner/", f"fleet-{n}", nat) for n in range(4)])
    again = _closes([("/ws/runner/", "fleet-0", nat)] * 2)

    assert fleet == [None] * 4  # four runners, one address, a limit of 2 per address: all in
    assert again == [None, protocol.CLOSE_RATE_LIMITED]  # fleet-0's third connect


@pytest.mark.django_db(transaction=True)
def test_refused_runner_tokens_are_limited_per_address(team: Workspace, limits: Callable[..., str]) -> None:
    limits("runner", user=(2, 60), ip=(2, 60))
    _instance(team, "good")

    guesses = _closes([("/ws/runner/", f"guess-{n}", "10.0.6.1") for n in range(4)])
    good_elsewhere = _closes([("/ws/runner/", "good", "10.0.6.2")])
    good_same_address = _closes([("/ws/runner/", "good", "10.0.6.1")])

    assert guesses == [protocol.CLOSE_UNAUTHORIZED] * 3 + [protocol.CLOSE_RATE_LIMITED]
    assert good_elsewhere == [None]
    assert good_same_address == [protocol.CLOSE_RATE_LIMITED]


def test_a_bad_rate_in_the_environment_fails_loudly_naming_the_variable() -> None:
    env = {**os.environ, "TRAINYARD_RATE_RUN_USER": "lots"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )

    assert result.returncode != 0
    assert "TRAINYARD_RATE_RUN_USER='lots' is not a rate" in result.stderr


def test_hits_just_before_a_window_boundary_still_count_just_after_it() -> None:
    from backend.core.ratelimit import _judge

    period, limit = 60, 2
    boundary = 1_800_000_000 - 1_800_000_000 % period
    # Two hits in the last second of a window, a third one a second into the next:
    # a fixed window would forget the first two and let twice the limit through.
    refusal = _judge("run", "user", limit, period, boundary + 1.0, current=1, previous=2)
    assert refusal is not None
    assert 1 <= refusal.retry_after <= period
    # Once most of the previous window has slid out, the hit is allowed again.
    assert _judge("run", "user", limit, period, boundary + 45.0, current=1, previous=2) is None

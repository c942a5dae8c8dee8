"""Tokens: each kind has its prefix (older tokens keep working), API tokens
can expire, and ``make run`` prints the same admin token on every start."""

from __future__ import annotations

import io
import stat
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient
from trainyard_runner import protocol

from backend.accounts.models import ApiToken, User
from backend.accounts.services import user_get_or_create
from backend.accounts.services.tokens import api_token_issue
from backend.clouds.models import Instance, InstanceStatus
from backend.clouds.services.instances import (
    instance_bootstrap_exchange,
    instance_for_token,
    instance_runner_token,
    runner_token,
)
from backend.config.asgi import application
from backend.core.tokens import hash_token
from tests.support.fixtures import Person

pytestmark = pytest.mark.django_db


def _me(token: str) -> Any:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client.get("/api/v1/me/")


# ------------------------------------------------------------------ expiry


def test_a_token_made_to_expire_works_until_then_and_is_refused_after_with_a_clear_message(owner: Person) -> None:
    made = owner.client().post("/api/v1/tokens/", {"name": "ci", "expires_in": "30d"}, format="json")
    token = made.json()["token"]
    expires_at = ApiToken.objects.get(name="ci").expires_at
    assert expires_at is not None

    working = _me(token)
    ApiToken.objects.filter(name="ci").update(expires_at=timezone.now() - timedelta(seconds=1))
    refused = _me(token)

    assert made.status_code == 201
    assert abs(expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    assert made.json()["expires_at"].startswith(expires_at.strftime("%Y-%m-%dT%H:%M"))
    assert working.status_code == 200
    assert refused.status_code == 401
    assert refused.json()["message"].startswith("This API token expired at ")
    assert "trainyard token create" in refused.json()["message"]


def test_a_token_without_expires_in_expires_after_the_default_90_days(owner: Person) -> None:
    absent = owner.client().post("/api/v1/tokens/", {"name": "plain"}, format="json").json()
    empty = owner.client().post("/api/v1/tokens/", {"name": "empty", "expires_in": ""}, format="json").json()
    listed = {t["name"]: t for t in owner.client().get("/api/v1/tokens/").json()}

    for made in (absent, empty):
        expires_at = ApiToken.objects.get(pk=made["id"]).expires_at
        assert expires_at is not None
        assert abs(expires_at - (timezone.now() + timedelta(days=90))) < timedelta(minutes=1)
        assert listed[made["name"]]["expires_at"] == made["expires_at"]
        assert "token" not in listed[made["name"]]


def test_the_default_lifetime_is_a_setting_and_never_is_asked_for_by_name(owner: Person, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "API_TOKEN_DAYS": 7}
    week = owner.client().post("/api/v1/tokens/", {"name": "week"}, format="json").json()
    forever = owner.client().post("/api/v1/tokens/", {"name": "forever", "expires_in": "never"}, format="json")

    assert abs(ApiToken.objects.get(pk=week["id"]).expires_at - (timezone.now() + timedelta(days=7))) < timedelta(
        minutes=1
    )
    assert forever.status_code == 201
    assert forever.json()["expires_at"] is None


def test_the_cli_says_when_a_new_token_expires(live_server: Any, transactional_db: None, owner: Person) -> None:
    from click.testing import CliRunner
    from trainyard.cli import cli

    env = {"TRAINYARD_URL": live_server.url, "TRAINYARD_TOKEN": owner.token}
    made = CliRunner().invoke(cli, ["token", "create", "--name", "laptop"], env=env)

    assert made.exit_code == 0, made.output
    row = ApiToken.objects.get(name="laptop")
    assert row.expires_at is not None
    assert f"(laptop) expires {row.expires_at:%Y-%m-%dT%H:%M}" in made.stderr


@pytest.mark.parametrize(
    ("expires_in", "message"),
    [
        ("soon", "Say how long the token lives as a number and a unit (30d, 12h, 90m or 2w), or never."),
        ("30s", "A token lives between 1 minute and 3650 days."),
        ("3651d", "A token lives between 1 minute and 3650 days."),
    ],
)
def test_a_bad_lifetime_is_a_400_and_makes_no_token(owner: Person, expires_in: str, message: str) -> None:
    before = ApiToken.objects.count()

    answer = owner.client().post("/api/v1/tokens/", {"name": "x", "expires_in": expires_in}, format="json")

    assert answer.status_code == 400
    assert answer.json()["message"] == f"Invalid input: expires_in: {message}"
    assert ApiToken.objects.count() == before


@pytest.mark.django_db(transaction=True)  # the follower reads the token in a thread of its own
def test_an_expired_token_cannot_follow_runs_either(team: Any, owner: Person) -> None:
    issued = api_token_issue(user=owner.user, name="ci", expires_in=timedelta(minutes=5))
    ApiToken.objects.filter(pk=issued.row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    async def close_code() -> int:
        ws = WebsocketCommunicator(
            application,
            f"/ws/v1/workspaces/{team.slug}/runs/",
            headers=[(b"authorization", f"Bearer {issued.token}".encode())],
        )
        await ws.connect()
        closed = await ws.receive_output(timeout=5)
        await ws.wait()
        return int(closed["code"])

    assert async_to_sync(close_code)() == 4401


# ------------------------------------------------------------------ prefixes


def _instance(**fields: Any) -> Instance:
    return Instance.objects.create(**{"backend": "local", "name": "l", "status": InstanceStatus.IDLE, **fields})


def test_every_kind_of_token_has_its_prefix(team: Any, owner: Person) -> None:
    api = owner.client().post("/api/v1/tokens/", {"name": "ci"}, format="json").json()["token"]
    key = "ty-00000000-0000-0000-0000-000000000001"
    booted = _instance(workspace=team, idempotency_key="ty-boot", token_hash="x" * 64, bootstrap_token_hash="b")
    Instance.objects.filter(pk=booted.pk).update(bootstrap_token_hash=hash_token("boot-token"))
    exchanged = instance_bootstrap_exchange(instance_id=str(booted.pk), token="boot-token")
    registered = owner.client().post(f"/api/v1/workspaces/{team.slug}/runners/registration-tokens/", {}, format="json")
    machine = APIClient().post("/api/v1/runner/register/", {"token": registered.json()["token"], "name": "box"})

    assert api.startswith("trainyard_")
    assert runner_token(key).startswith("tyrun_")
    assert exchanged is not None and exchanged.startswith("tyrun_")
    assert registered.json()["token"].startswith("tyreg_")
    assert machine.json()["runner_token"].startswith("tyrun_")


def test_tokens_made_before_the_prefixes_keep_working(team: Any) -> None:
    user = user_get_or_create(username="old-timer")
    ApiToken.objects.create(user=user, name="old", token_hash=hash_token("trainyard-old-no-prefix"), prefix="old")
    key = "ty-00000000-0000-0000-0000-000000000002"
    bare = runner_token(key).removeprefix("tyrun_")
    old_row = _instance(workspace=team, idempotency_key=key, token_hash=hash_token(bare))
    new_row = _instance(
        workspace=team, idempotency_key="ty-new", token_hash=hash_token(runner_token("ty-new")), name="n"
    )

    assert _me("trainyard-old-no-prefix").status_code == 200
    assert instance_for_token(token=bare) == old_row
    # A machine requested before the upgrade but launched after gets the token its row expects.
    assert instance_runner_token(old_row) == bare
    assert instance_runner_token(new_row) == runner_token("ty-new")


def test_a_runner_token_given_to_the_api_is_told_what_it_is(team: Any) -> None:
    _instance(workspace=team, idempotency_key="ty-r", token_hash=hash_token(runner_token("ty-r")))

    answer = _me(runner_token("ty-r"))

    assert answer.status_code == 401
    assert answer.json()["message"].startswith("This is a runner token (tyrun_…), not a personal API token")


def test_an_api_token_given_to_the_runner_socket_is_told_what_it_is(owner: Person) -> None:
    async def closed() -> dict[str, Any]:
        ws = WebsocketCommunicator(
            application, "/ws/runner/", headers=[(b"authorization", f"Bearer {owner.token}".encode())]
        )
        await ws.connect()
        message = await ws.receive_output(timeout=5)
        await ws.wait()
        return dict(message)

    message = async_to_sync(closed)()

    assert message["code"] == protocol.CLOSE_UNAUTHORIZED
    assert message["reason"] == "this is a personal API token (trainyard_…): a runner connects with its runner token"


# ------------------------------------------------------------------ make run


def _kept(path: Path) -> str:
    out = io.StringIO()
    call_command("issue_token", "admin", "--name", "make-run", "--keep", str(path), stdout=out)
    return out.getvalue().strip()


def test_make_run_prints_the_same_admin_token_on_every_start_until_it_is_revoked(tmp_path: Path) -> None:
    path = tmp_path / "data" / "admin-token"

    first, second = _kept(path), _kept(path)
    ApiToken.objects.filter(token_hash=hash_token(first)).update(revoked_at=timezone.now())
    third = _kept(path)

    assert first == second and first.startswith("trainyard_")
    assert ApiToken.objects.filter(user__username="admin", revoked_at__isnull=True).count() == 1
    assert third != first and _me(third).status_code == 200
    assert path.read_text().strip() == third
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert User.objects.filter(username="admin").count() == 1

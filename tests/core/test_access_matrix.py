"""Every route × every kind of caller answers what ``access_matrix.py`` says,
and a denied request changes nothing in the database.

The routes come from the URL configuration and the websocket routing, so a
new endpoint fails ``test_every_route_and_method_has_expectations`` until
its row is written. The world is real: two workspaces, made by the services
(runs, a job running on a registered runner, artifacts, a tag, secrets,
registration tokens, an invitation); each call runs in a savepoint that is
rolled back, so every caller meets the same world.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient
from trainyard_runner.protocol import EnvironmentReport
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from backend.access.models import AccessSession
from backend.accounts.models import DeviceLogin, Invitation, Role, Workspace
from backend.accounts.services.ssh_keys import ssh_key_add
from backend.artifacts.archive import archive_url
from backend.artifacts.models import Artifact
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete, artifact_file_key
from backend.artifacts.storage import get_storage
from backend.clouds.services.selfhosted import Registered, registration_token_create, runner_register
from backend.clouds.services.volumes import volume_create
from backend.config.routing import websocket_urlpatterns
from backend.core.tokens import hash_token
from backend.notify.models import Scope, Subscription
from backend.runs.lifecycle.transitions import job_assign
from backend.runs.models import Job, Run, RunStatus
from backend.runs.services.environments import environment_record
from backend.runs.services.tags import tag_set
from backend.vault.services import repo_credential_set, secret_set
from tests.core.access_matrix import CALLERS, ROUTES, WEBSOCKETS, WS_OPEN, Call
from tests.support.attempts import job_credential
from tests.support.fixtures import WORKFLOWS, Person, submit
from tests.support.web import WebServers

ENVIRONMENT_KEY = "e" * 24
DEVICE_USER_CODE = "BCDF-GHJK"  # a pending `trainyard login` in the browser
MEMBER_SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBtOe0TxQVSC5KoermSUTLy0wfYWTO+ew2aN8Sfk9jsd member"
CODE = {"kind": "git", "repo_url": "https://example.com/acme/models.git", "commit": "c" * 40}
# Columns a request may touch without changing anything (a token's last use).
IGNORED_COLUMNS = {"accounts_apitoken": ("last_used_at",)}
# Written by the server's own clock, whoever calls: a web process's pulse every few seconds.
IGNORED_TABLES = {"clouds_webpulse"}


@dataclass
class World:
    people: dict[str, Person]
    team: Workspace
    run: Run
    job: Job
    artifact: Artifact
    uploading: Artifact
    runner: Registered
    other_runner: Registered
    invitation: Invitation
    registration_token_id: str
    session: str = ""  # the member's session into the run's job

    def value(self, name: str) -> str:
        """A URL parameter's value: a name from ``Call.params``, or the parameter's own name."""
        storage = get_storage()
        values = {
            "workspace": self.team.slug,
            "run": self.run.name,
            "job": str(self.job.pk),
            "artifact": str(self.artifact.pk),
            "uploading_artifact": str(self.uploading.pk),
            "invitation": str(self.invitation.pk),
            "runner": str(self.runner.instance.pk),
            "registration_token_id": self.registration_token_id,
            "session": self.session,
            "member_token_id": str(self.people["member"].user.api_tokens.get().pk),
            "member_username": self.people["member"].user.username,
            "member_ssh_key_fingerprint": self.people["member"].user.ssh_keys.get().fingerprint,
            "tag_name": "best",
            "done_run": Run.objects.get(workspace=self.team, status=RunStatus.SUCCEEDED).name,
            "environment_key": ENVIRONMENT_KEY,
            "device_user_code": DEVICE_USER_CODE,
            "secret_name": "HF_TOKEN",
            "backend_name": self.runner.instance.account.name,
            "volume_name": "scratch",
            "member_subscription": str(Subscription.objects.get(workspace=self.team, scope=Scope.MINE).pk),
            "workspace_subscription": str(Subscription.objects.get(workspace=self.team, scope=Scope.WORKSPACE).pk),
            "file_path": "w.bin",
            "storage_token": _token_of(
                storage.signed_url(artifact_file_key(self.artifact, self.artifact.files.get()), method="GET"),
                "/storage/",
            ),
            "archive_token": _token_of(archive_url(artifact=self.artifact, prefix=""), "/storage-archive/"),
        }
        return values.get(name, name)

    def body(self, body: Any) -> Any:
        if body == "run_body":
            return {"workflow": "hello", "workflows_file": {"path": "w.yaml", "text": WORKFLOWS}, "code": CODE}
        if body == "tag_body":
            return {"name": "newest", "run": Run.objects.get(workspace=self.team, status=RunStatus.SUCCEEDED).name}
        if body == "register_body":
            issued = registration_token_create(workspace=self.team, user=self.people["admin"].user)
            return {"token": issued.token, "name": "another-box"}
        return body

    def client(self, caller: str, url: str = "") -> APIClient:
        """``caller``'s client; a runner calling for a job (``/api/v1/runner/jobs/…``)
        sends the job's attempt token beside its own, as ``AssignJob.job_token`` gives it."""
        client = APIClient()
        runner_token = self.runner.runner_token
        if url.startswith("/api/v1/runner/jobs/"):
            runner_token = job_credential(runner_token, self.job)
        token = {
            "anonymous": None,
            "runner": runner_token,
            "other_runner": self.other_runner.runner_token,
        }.get(caller, self.people[caller].token if caller in self.people else None)
        if token:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        return client


@pytest.fixture
def world(
    team: Workspace, owner: Person, member: Person, viewer: Person, outsider: Person, settings: Any, tmp_path: Path
) -> World:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    run = submit(team, owner.user)
    job = run.jobs.get()
    artifact = _artifact(job, b"one")
    done = submit(team, owner.user)
    Run.objects.filter(pk=done.pk).update(status=RunStatus.SUCCEEDED)  # as its jobs' ends would make it
    done.refresh_from_db()
    tag_set(workspace=team, user=owner.user, name="best", run=done, force=False)
    secret_set(workspace=team, user=owner.user, name="HF_TOKEN", value="hf_secret_value")
    repo_credential_set(
        workspace=team, user=owner.user, url="https://example.com/acme/private.git", kind="https-token",
        secret="ghp_secret", username="",
    )  # fmt: skip
    issued = registration_token_create(workspace=team, user=owner.user, note="unused")
    runner = runner_register(token=registration_token_create(workspace=team, user=owner.user).token, name="box")
    with transaction.atomic():
        job_assign(job=Job.objects.select_for_update().get(pk=job.pk), instance=runner.instance)
    uploading, _ = artifact_begin(job=job, path="./out", files=[FileIn("w.bin", 3, hashlib.sha256(b"two").hexdigest())])
    report = EnvironmentReport(
        key=ENVIRONMENT_KEY, built=True, build_seconds=1.5, size_bytes=10, lock="x==1\n", packages="x==1\n"
    )
    assert environment_record(job_id=str(job.pk), instance_id=str(runner.instance.pk), attempt=1, report=report)
    # A volume: a folder of the registered machine (a self-hosted volume; no cloud call).
    volume_create(workspace=team, user=owner.user, name="scratch", size="1GB", backend="self-hosted", machine="box")
    # Notification subscriptions: the workspace's (an admin's) and the member's own.
    for who, scope in ((owner, Scope.WORKSPACE), (member, Scope.MINE)):
        Subscription.objects.create(
            workspace=team,
            created_by=who.user,
            kind="slack",
            scope=scope,
            target="https://1.1.1.1/hook",
            events=["run.failed"],
        )
    # The outsider's own workspace, with a run, a secret and a runner of its own.
    theirs = outsider.user.personal_workspace
    submit(theirs, outsider.user)
    secret_set(workspace=theirs, user=outsider.user, name="HF_TOKEN", value="their_secret_value")
    other = runner_register(token=registration_token_create(workspace=theirs, user=outsider.user).token, name="box")
    invitation = Invitation.objects.create(
        workspace=team, github_login="someone", role=Role.MEMBER, invited_by=owner.user
    )
    ssh_key_add(user=member.user, public_key=MEMBER_SSH_KEY)
    DeviceLogin.objects.create(
        device_code_hash=hash_token("tydev_matrix"), user_code=DEVICE_USER_CODE.replace("-", ""),
        client_name="laptop", expires_at=timezone.now() + timedelta(minutes=10), interval=5,
    )  # fmt: skip
    people = {"outsider": outsider, "viewer": viewer, "member": member, "admin": owner}
    job.refresh_from_db()
    session = _session(job, member.user)
    return World(people, team, run, job, artifact, uploading, runner, other, invitation, str(issued.row.pk), session)


def _session(job: Job, user: Any) -> str:
    """A session of ``user`` into ``job`` as a grant writes it (its client has not connected)."""
    return str(
        AccessSession.objects.create(
            workspace=job.workspace, user=user, job=job, attempt=job.attempts.get(), instance=job.instance,
            kind="port", port=8888, token_hash=hash_token("tyses_x"), relay_key_hash=hash_token("key"),
            grant_expires_at=timezone.now() + timedelta(seconds=60),
        ).pk
    )  # fmt: skip


def _artifact(job: Job, data: bytes) -> Artifact:
    artifact, uploads = artifact_begin(
        job=job, path="./out", files=[FileIn("w.bin", len(data), hashlib.sha256(data).hexdigest())]
    )
    for upload in uploads:
        get_storage().write(f"{artifact.storage_prefix}/{upload.path}", iter([data]))
    return artifact_complete(artifact=artifact)


def _token_of(url: str, marker: str) -> str:
    return url.split(marker, 1)[1]


# ------------------------------------------------------------------ the routes


def _routes(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(route, view callback) of every URL pattern; Django's admin counts as one route."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            if route == "admin/":
                yield route, None
                continue
            yield from _routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route, pattern.callback


def _methods(callback: Any) -> set[str] | None:
    """The methods a DRF or class-based view answers; None for a function view."""
    view = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view is None:
        return None
    return {m.upper() for m in ("get", "post", "put", "patch", "delete") if hasattr(view, m)}


URL_ROUTES = dict(_routes(get_resolver().url_patterns))
CASES = [(route, method) for route, methods in ROUTES.items() for method in methods]


def test_every_route_and_method_has_expectations() -> None:
    assert sorted(set(URL_ROUTES) - set(ROUTES)) == [], "routes with no row in tests/core/access_matrix.py"
    assert sorted(set(ROUTES) - set(URL_ROUTES)) == [], "rows of tests/core/access_matrix.py with no route"
    for route, callback in URL_ROUTES.items():
        methods = _methods(callback)
        if methods is not None:
            assert set(ROUTES[route]) == methods, f"{route}: the view answers {sorted(methods)}"
    for route, methods in ROUTES.items():
        for method, call in methods.items():
            assert set(call.expect) == set(CALLERS), f"{method} {route}: say what each caller gets"
    routed = {str(p.pattern) for p in websocket_urlpatterns}
    assert routed == set(WEBSOCKETS), "websocket routes and WEBSOCKETS in tests/core/access_matrix.py differ"


@pytest.mark.parametrize(("route", "method"), CASES, ids=[f"{m} {r}" for r, m in CASES])
def test_each_caller_gets_the_expected_status_and_a_denial_changes_nothing(
    route: str, method: str, world: World, settings: Any
) -> None:
    call = ROUTES[route][method]
    url = _url(route, call, world)
    wrong = []
    for caller in CALLERS:
        # Fresh rate-limit and sign-in lockout counters too: the callers before
        # it (seven wrong passwords for one username, say) must not decide this one's answer.
        settings.TRAINYARD = {**settings.TRAINYARD, "RATE_LIMIT_PREFIX": f"matrix-{secrets.token_hex(4)}:ratelimit"}
        before = _fingerprint()
        with transaction.atomic():
            status = _request(world.client(caller, url), method, url, world.body(call.body))
            changed = _fingerprint() != before
            transaction.set_rollback(True)
        if status != call.expect[caller]:
            wrong.append(f"{caller}: {status}, expected {call.expect[caller]}")
        if (status >= 400 or caller in call.unchanged) and changed:
            wrong.append(f"{caller}: answered {status} but the database changed")
    assert not wrong, f"{method} {url}: " + "; ".join(wrong)


# Routes that name one of acme's objects by id (or a run by name or id): the
# outsider who names it under their own workspace must not reach it either.
OBJECT_ROUTES = [
    (route, method)
    for route, method in CASES
    if route.startswith("api/v1/workspaces/<slug:workspace>/") and ("<uuid:" in route or "<str:run>" in route)
]


@pytest.mark.parametrize(("route", "method"), OBJECT_ROUTES, ids=[f"{m} {r}" for r, m in OBJECT_ROUTES])
def test_another_workspaces_object_named_under_ones_own_workspace_is_404(
    route: str, method: str, world: World, outsider: Person
) -> None:
    call = ROUTES[route][method]
    own = outsider.user.personal_workspace.slug
    for run in (world.run.name, str(world.run.pk)):
        url = _url(route, call, world).replace(f"/workspaces/{world.team.slug}/", f"/workspaces/{own}/", 1)
        url = url.replace(f"/runs/{world.run.name}/", f"/runs/{run}/", 1)
        before = _fingerprint()
        with transaction.atomic():
            status = _request(world.client("outsider"), method, url, world.body(call.body))
            transaction.set_rollback(True)
        assert (status, _fingerprint() == before) == (404, True), f"{method} {url}"


def _url(route: str, call: Call, world: World) -> str:
    if route.startswith("^"):
        return "/w/acme/runs/"
    if route == "admin/":
        return "/admin/"

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        return world.value(call.params.get(name, name))

    path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", fill, route)
    query = re.sub(r"<(\w+)>", fill, call.query)  # a query may name the world's values too
    return f"{path}?{query}" if query else path


def _request(client: APIClient, method: str, url: str, body: Any) -> int:
    if isinstance(body, bytes):
        response = client.generic(method, url, body, content_type="application/octet-stream")
    else:
        response = getattr(client, method.lower())(url, body, format="json")
    if getattr(response, "is_async", False):  # the raw log: an async body, read as a client would
        async_to_sync(_drain)(response.streaming_content)
    elif hasattr(response, "streaming_content"):
        b"".join(response.streaming_content)
    return int(response.status_code)


async def _drain(body: AsyncIterator[bytes]) -> None:
    async for _ in body:
        pass


def _fingerprint() -> dict[str, str]:
    """A digest of every table's rows (but the tables and columns ``IGNORED_TABLES`` and ``IGNORED_COLUMNS`` let go)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")
        tables = [row[0] for row in cursor.fetchall() if row[0] not in IGNORED_TABLES]
        parts = []
        for table in tables:
            drop = "".join(f" - '{column}'" for column in IGNORED_COLUMNS.get(table, ()))
            parts.append(
                f"SELECT '{table}', md5(coalesce(string_agg((to_jsonb(t){drop})::text, '|' "
                f"ORDER BY (to_jsonb(t){drop})::text), '')) FROM \"{table}\" t"
            )
        cursor.execute(" UNION ALL ".join(parts))
        return dict(cursor.fetchall())


# ------------------------------------------------------------------ websockets


def _ws_path(route: str, world: World) -> str:
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: world.value(m.group(1)), route)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", list(WEBSOCKETS))
def test_each_caller_of_a_websocket_is_accepted_or_closed_as_expected(
    route: str, world: World, web_server: WebServers
) -> None:
    """Over the real ASGI server and real websockets, as a browser or runner
    connects (an in-process communicator once hung its event loop's shutdown
    on a loaded machine). Its rate-limit counters are its own."""
    server = web_server.start(TRAINYARD_CHANNEL_PREFIX=f"matrix-{secrets.token_hex(4)}")
    url = server.ws_url + _ws_path(route, world)
    wrong = []
    for caller in CALLERS:
        before = _fingerprint()
        code = _ws_outcome(url, _bearer(world, caller))
        if code != WEBSOCKETS[route][caller]:
            wrong.append(f"{caller}: {code}, expected {WEBSOCKETS[route][caller]}")
        if code != WS_OPEN and _fingerprint() != before:
            wrong.append(f"{caller}: closed with {code} but the database changed")
    assert not wrong, f"{url}: " + "; ".join(wrong)


def _bearer(world: World, caller: str) -> str | None:
    credentials = world.client(caller)._credentials  # type: ignore[attr-defined]
    header = credentials.get("HTTP_AUTHORIZATION")
    return str(header) if header else None


def _ws_outcome(url: str, authorization: str | None) -> int:
    """The close code, or ``WS_OPEN``. A follower's socket answers at once:
    its first frame or a close. A runner's sends nothing until the runner's
    hello: a close within 3 s, or open."""
    headers = {"Authorization": authorization} if authorization else {}
    try:
        with ws_connect(url, additional_headers=headers, open_timeout=10, close_timeout=2) as ws:
            ws.recv(timeout=3 if url.endswith("/ws/runner/") else 10)
    except TimeoutError:
        return WS_OPEN
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else 1006
    except InvalidStatus as refused:  # closed before the accept: the handshake's HTTP status
        return refused.response.status_code
    return WS_OPEN  # a first frame: accepted


def test_the_fingerprint_sees_a_change_of_any_tenant_row(world: World) -> None:
    before = _fingerprint()
    secret_set(workspace=world.team, user=world.people["admin"].user, name="HF_TOKEN", value="another_value")

    assert _fingerprint() != before

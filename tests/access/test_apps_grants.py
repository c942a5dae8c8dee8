"""Opening a job's port in the browser, up to the proxy's door: the
dashboard's ``/open/`` grant and its refusals, the one-time code swapped for
the app's own cookie, and every request on the apps host checked (signed in,
still a member who may run jobs, the attempt still running, the app's own
origin). Through the real ASGI application (host dispatch included); the
forwarding itself is tested in test_apps_engine.py and end to end in
tests/e2e/test_access_apps.py."""

from __future__ import annotations

import time
from html import unescape
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.test import Client, override_settings
from trainyard_runner import protocol

from backend.access.models import AccessSession
from backend.access.webapps import passes
from backend.access.webapps.origin import AppsOrigin, app_label
from backend.accounts.models import Membership, Role, Workspace
from backend.clouds.models import Instance
from backend.clouds.services.selfhosted import registration_token_create, runner_register
from backend.config.asgi import application
from backend.runs.lifecycle.transitions import job_assign
from backend.runs.models import Attempt, AttemptStatus, Job
from tests.support.attempts import accept, current_attempt
from tests.support.fixtures import Person, submit

pytestmark = pytest.mark.django_db(transaction=True)
PORT = 8888


@pytest.fixture
def running(team: Workspace, owner: Person) -> Job:
    """acme's job, running on a connected runner that serves sessions, with port 8888."""
    run = submit(team, owner.user)
    job = run.jobs.get()
    box = runner_register(token=registration_token_create(workspace=team, user=owner.user).token, name="box")
    with transaction.atomic():
        job_assign(job=Job.objects.select_for_update().get(pk=job.pk), instance=box.instance)
    assert accept(job, box.instance.pk)
    Instance.objects.filter(pk=box.instance.pk).update(
        status="busy", channel_name="specific.test!runner", relay_version=protocol.RELAY_VERSION
    )
    Job.objects.filter(pk=job.pk).update(ports=[PORT])
    job.refresh_from_db()
    return job


def signed_in(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def open_path(job: Job, port: int = PORT, workspace: str = "acme") -> str:
    return f"/open/{workspace}/{job.run.name}/{job.name}/{port}/"


def label_of(job: Job, port: int = PORT) -> str:
    return app_label(secret=settings.SECRET_KEY, attempt_id=str(current_attempt(job).pk), port=port)


def app_get(url: str, *, cookie: str = "", **headers: str) -> httpx.Response:
    return async_to_sync(_asgi)("GET", url, cookie=cookie, **headers)


async def _asgi(method: str, url: str, *, cookie: str = "", **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=application, client=("203.0.113.9", 5000))
    async with httpx.AsyncClient(transport=transport) as client:
        sent = {**headers, **({"Cookie": cookie} if cookie else {})}
        return await client.request(method, url, headers=sent)


def entered(member: Person, job: Job) -> tuple[str, str]:
    """(the app's origin, its cookie) after the member opened port 8888."""
    opened = signed_in(member).get(open_path(job))
    location = urlsplit(opened["Location"])
    origin = f"{location.scheme}://{location.netloc}"
    answer = app_get(opened["Location"])
    assert answer.status_code == 302, answer.text
    return origin, answer.headers["set-cookie"].split(";")[0]


def test_a_member_opening_a_port_is_sent_to_the_apps_own_origin_with_a_one_time_code(
    member: Person, running: Job
) -> None:
    opened = signed_in(member).get(open_path(running))

    assert opened.status_code == 302
    location = urlsplit(opened["Location"])
    assert (location.scheme, location.hostname) == ("http", f"{label_of(running)}.apps.localhost")
    assert (location.path, location.query[:5]) == ("/_trainyard/enter", "code=")
    session = AccessSession.objects.get()
    assert (session.user, session.kind, session.port, session.client_label, session.state) == (
        member.user, "port", PORT, "app proxy", "granted"
    )  # fmt: skip


def test_the_code_is_swapped_once_for_a_host_only_http_only_cookie_of_that_app(member: Person, running: Job) -> None:
    enter = signed_in(member).get(open_path(running), {"path": "/lab/tree"})["Location"]

    first = app_get(enter)
    again = app_get(enter)

    assert first.status_code == 302 and first.headers["location"] == "/lab/tree"
    name, _, attributes = first.headers["set-cookie"].partition(";")
    assert name.startswith("trainyard-app=")
    assert sorted(a.strip().split("=")[0] for a in attributes.split(";")) == [
        "HttpOnly", "Max-Age", "Path", "SameSite"
    ]  # fmt: skip
    assert "SameSite=Lax" in attributes and "Path=/" in attributes
    assert again.status_code == 403 and "This link has expired" in again.text
    assert "set-cookie" not in again.headers


def test_over_https_the_cookie_is_secure_and_host_prefixed(member: Person, running: Job) -> None:
    with override_settings(APPS=AppsOrigin(scheme="https", domain="apps.example.com", port="")):
        enter = signed_in(member).get(open_path(running))["Location"]
        answer = app_get(enter)

    assert enter.startswith(f"https://{label_of(running)}.apps.example.com/_trainyard/enter?code=")
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith("__Host-trainyard-app=") and cookie.endswith("; HttpOnly; SameSite=Lax; Secure")
    assert "Domain" not in cookie and "; Path=/;" in cookie


def test_an_https_app_asked_for_over_plain_http_is_sent_to_https(member: Person, running: Job) -> None:
    with override_settings(APPS=AppsOrigin(scheme="https", domain="apps.example.com", port="")):
        answer = app_get(f"http://{label_of(running)}.apps.example.com/lab/tree?x=1")

    assert answer.status_code == 308
    assert answer.headers["location"] == f"https://{label_of(running)}.apps.example.com/lab/tree?x=1"


def test_two_passes_for_one_app_are_trusted_neither(member: Person, running: Job) -> None:
    origin, first = entered(member, running)
    _, second = entered(member, running)
    assert first != second

    answer = app_get(f"{origin}/", cookie=f"{first}; {second}")

    assert answer.status_code == 403 and "opens only from the Trainyard dashboard" in answer.text


def test_a_code_is_good_for_one_app_and_one_minute(
    member: Person, running: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    enter = urlsplit(signed_in(member).get(open_path(running))["Location"])
    other_host = enter.netloc.replace(label_of(running), label_of(running, port=6006))
    assert app_get(f"http://{other_host}/_trainyard/enter?{enter.query}").status_code == 403

    later = time.time() + passes.CODE_SECONDS + 1
    monkeypatch.setattr(time, "time", lambda: later)
    late = app_get(enter.geturl())
    assert late.status_code == 403 and "works once, within 60 seconds" in late.text


@pytest.mark.parametrize(
    ("who", "port", "status", "says"),
    [
        ("viewer", PORT, 403, "Your role in acme is viewer: only members and admins open sessions into jobs."),
        ("outsider", PORT, 404, "There is no job"),
        ("member", 9999, 404, "serves no port 9999: its ports are 8888."),
    ],
)
def test_who_may_not_open_a_port_is_told_why_and_nothing_is_granted(
    request: pytest.FixtureRequest, running: Job, who: str, port: int, status: int, says: str
) -> None:
    answer = signed_in(request.getfixturevalue(who)).get(open_path(running, port=port))

    assert answer.status_code == status
    assert says in answer.content.decode()
    assert not AccessSession.objects.exists()


def test_a_signed_out_browser_is_sent_to_sign_in_and_a_job_not_running_cannot_open(
    member: Person, team: Workspace, owner: Person
) -> None:
    pending = submit(team, owner.user).jobs.get()
    Job.objects.filter(pk=pending.pk).update(ports=[PORT])

    assert Client().get(open_path(pending))["Location"] == "/"
    refused = signed_in(member).get(open_path(pending))
    assert refused.status_code == 409
    assert "is pending: wait until it runs" in refused.content.decode()


def test_the_apps_host_needs_the_apps_own_pass_and_never_reaches_the_dashboard(member: Person, running: Job) -> None:
    origin, cookie = entered(member, running)
    other = origin.replace(label_of(running), label_of(running, port=6006))
    dashboard_cookies = "; ".join(f"{k}={v.value}" for k, v in signed_in(member).cookies.items())

    bare = app_get(f"{origin}/")
    theirs = app_get(f"{other}/", cookie=cookie)
    api = app_get(f"{origin}/api/v1/me/", cookie=dashboard_cookies)
    unknown = app_get(f"http://nothing.{settings.APPS.domain}/api/v1/health/")

    assert bare.status_code == theirs.status_code == api.status_code == 403
    assert "opens only from the Trainyard dashboard" in bare.text
    assert "opens only from the Trainyard dashboard" in api.text  # the proxy's page, not the API's answer
    assert unknown.status_code == 404 and "There is no app at this address" in unknown.text


def test_the_dashboard_host_never_swaps_a_code(member: Person, running: Job) -> None:
    enter = urlsplit(signed_in(member).get(open_path(running))["Location"])

    answer = app_get(f"http://127.0.0.1:8000/_trainyard/enter?{enter.query}")

    assert "set-cookie" not in answer.headers or "trainyard-app" not in answer.headers["set-cookie"]
    assert app_get(enter.geturl()).status_code == 302  # the code is still unspent


def test_a_pass_holds_while_signed_in_as_a_member_of_the_running_attempt(member: Person, running: Job) -> None:
    app_pass = _pass(member, running)

    assert passes.pass_check(app_pass).refusal is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("sign_out", "signed out: the session has ended. Sign in to the dashboard"),
        ("made_viewer", "only members and admins of the workspace open its jobs' apps"),
        ("removed", "no longer a member of this workspace"),
        ("attempt_ended", "no longer runs this attempt"),
    ],
)
def test_the_app_closes_when_its_grant_no_longer_holds(member: Person, running: Job, change: str, says: str) -> None:
    client = signed_in(member)
    origin, cookie = _entered_with(client, running)
    if change == "sign_out":
        assert client.post("/api/v1/auth/logout/").status_code == 204
    elif change == "made_viewer":
        Membership.objects.filter(user=member.user).update(role=Role.VIEWER)
    elif change == "removed":
        Membership.objects.filter(user=member.user).delete()
    else:
        Attempt.objects.filter(job=running).update(status=AttemptStatus.ENDED)

    closed = app_get(f"{origin}/", cookie=cookie)

    assert closed.status_code == 403
    assert "This app is closed: " in closed.text and says in unescape(closed.text)


def test_a_websocket_or_a_write_from_another_origin_is_refused(member: Person, running: Job) -> None:
    origin, cookie = entered(member, running)
    sibling = origin.replace(label_of(running), label_of(running, port=6006))

    post = async_to_sync(_asgi)("POST", f"{origin}/api/kernels", cookie=cookie, Origin=sibling)
    outcome = async_to_sync(_websocket)(f"{origin}/api/kernels/k/channels", cookie=cookie, origin=sibling)

    assert post.status_code == 403 and "must come from its own pages" in post.text
    assert outcome == {"type": "websocket.close", "code": 1008}


# --- helpers -------------------------------------------------------------------


def _entered_with(client: Client, job: Job) -> tuple[str, str]:
    opened = client.get(open_path(job))
    location = urlsplit(opened["Location"])
    answer = app_get(opened["Location"])
    return f"{location.scheme}://{location.netloc}", answer.headers["set-cookie"].split(";")[0]


def _pass(member: Person, job: Job) -> passes.AppPass:
    _, cookie = entered(member, job)
    found = passes.pass_unseal(cookie.partition("=")[2], label=label_of(job))
    assert found is not None
    return found


async def _websocket(url: str, *, cookie: str, origin: str) -> dict[str, Any]:
    parts = urlsplit(url)
    scope = {
        "type": "websocket",
        "path": parts.path,
        "raw_path": parts.path.encode(),
        "query_string": b"",
        "headers": [(b"host", parts.netloc.encode()), (b"cookie", cookie.encode()), (b"origin", origin.encode())],
        "subprotocols": [],
        "client": ("203.0.113.9", 5000),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await application(scope, receive, send)
    return sent[-1]

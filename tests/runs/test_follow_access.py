"""Who may follow a run over the real ASGI server (uvicorn) and a real
websocket: cookie-authenticated sockets only from our own origin (item 5),
and open sockets closed once their access is gone (item 6)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from backend.accounts.models import ApiToken, User
from backend.runs.models import Run
from tests.support.fixtures import Person
from tests.support.web import WebServer, WebServers

pytestmark = pytest.mark.django_db(transaction=True)

CLOSE_WITHIN_SECONDS = 10.0  # the server re-checks every second here


def session_cookie(user: User) -> str:
    """A signed-in browser's session cookie (the session is stored in the database)."""
    browser = Client()
    browser.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"


def follow(server: WebServer, run: Run, headers: dict[str, str]) -> ClientConnection:
    url = f"{server.ws_url}/ws/v1/workspaces/acme/runs/{run.name}/"
    return connect(url, additional_headers=headers, open_timeout=10, close_timeout=2)


def first_frame(ws: ClientConnection) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(ws.recv(timeout=10))
    return frame


def closed_with(ws: ClientConnection) -> tuple[int, str]:
    """Reads until the server closes the socket; its close code and reason."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=CLOSE_WITHIN_SECONDS)
    assert closed.value.rcvd is not None, f"the socket was not closed by the server: {closed.value}"
    return closed.value.rcvd.code, closed.value.rcvd.reason


# --- item 5: the Origin of cookie-authenticated sockets ----------------------------


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:1",  # another port of the same host: same site, other origin
        "http://evil.example",
        None,  # no Origin at all
    ],
)
def test_a_page_of_another_origin_cannot_follow_a_signed_in_persons_run(
    web_server: WebServers, run: Run, member: Person, origin: str | None
) -> None:
    server = web_server.start()
    headers = {"Cookie": session_cookie(member.user)} | ({"Origin": origin} if origin else {})

    with pytest.raises(InvalidStatus) as refused:
        follow(server, run, headers)

    assert refused.value.response.status_code == 403


def test_the_dashboard_on_its_own_origin_and_the_cli_with_a_token_follow(
    web_server: WebServers, run: Run, member: Person
) -> None:
    server = web_server.start()

    with follow(server, run, {"Cookie": session_cookie(member.user), "Origin": server.url}) as browser:
        from_browser = first_frame(browser)
    # The CLI and runners send no Origin: the token is their credential.
    with follow(server, run, {"Authorization": f"Bearer {member.token}"}) as cli:
        from_cli = first_frame(cli)

    assert from_browser["type"] == from_cli["type"] == "run"
    assert from_browser["run"]["name"] == from_cli["run"]["name"] == run.name


def test_a_trusted_origin_other_than_the_servers_own_may_follow(
    web_server: WebServers, run: Run, member: Person
) -> None:
    server = web_server.start(DJANGO_CSRF_TRUSTED_ORIGINS="https://dash.example.com")

    with follow(server, run, {"Cookie": session_cookie(member.user), "Origin": "https://dash.example.com"}) as ws:
        assert first_frame(ws)["type"] == "run"


# --- item 6: access re-checked while the socket is open -------------------------------


@pytest.fixture
def rechecking(web_server: WebServers) -> WebServer:
    return web_server.start(TRAINYARD_WS_RECHECK_SECONDS="1")


def test_signing_out_closes_the_browsers_open_follow(rechecking: WebServer, run: Run, member: Person) -> None:
    browser = Client()
    browser.force_login(member.user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"
    with follow(rechecking, run, {"Cookie": cookie, "Origin": rechecking.url}) as ws:
        assert first_frame(ws)["type"] == "run"
        browser.post("/api/v1/auth/logout/")  # the dashboard's Sign out
        assert closed_with(ws) == (4401, "signed out: the session has ended")


def test_revoking_the_token_closes_the_clis_open_follow(rechecking: WebServer, run: Run, member: Person) -> None:
    token_id = ApiToken.objects.get(user=member.user).pk
    with follow(rechecking, run, {"Authorization": f"Bearer {member.token}"}) as ws:
        assert first_frame(ws)["type"] == "run"
        revoked = httpx.delete(
            f"{rechecking.url}/api/v1/tokens/{token_id}/", headers={"Authorization": f"Bearer {member.token}"}
        )
        assert revoked.status_code == 204, revoked.text
        assert closed_with(ws) == (4401, "the API token was revoked or has expired")


def test_removal_from_the_workspace_closes_the_open_follow(
    rechecking: WebServer, run: Run, member: Person, owner: Person
) -> None:
    with follow(rechecking, run, {"Authorization": f"Bearer {member.token}"}) as ws:
        assert first_frame(ws)["type"] == "run"
        removed = httpx.delete(
            f"{rechecking.url}/api/v1/workspaces/acme/members/{member.user.username}/",
            headers={"Authorization": f"Bearer {owner.token}"},
        )
        assert removed.status_code == 204, removed.text
        assert closed_with(ws) == (4403, "no longer a member of this workspace")


@pytest.mark.parametrize("credential", ["token", "cookie"])
def test_deactivating_the_account_closes_its_open_follows(
    rechecking: WebServer, run: Run, member: Person, credential: str
) -> None:
    headers = (
        {"Authorization": f"Bearer {member.token}"}
        if credential == "token"
        else {"Cookie": session_cookie(member.user), "Origin": rechecking.url}
    )
    with follow(rechecking, run, headers) as ws:
        assert first_frame(ws)["type"] == "run"
        User.objects.filter(pk=member.user.pk).update(is_active=False)  # an admin deactivates the account
        assert closed_with(ws) == (4401, "the account is deactivated")


def test_a_follow_with_access_stays_open_across_rechecks(rechecking: WebServer, run: Run, member: Person) -> None:
    with follow(rechecking, run, {"Authorization": f"Bearer {member.token}"}) as ws:
        assert first_frame(ws)["type"] == "run"
        with pytest.raises(TimeoutError):
            ws.recv(timeout=3.5)  # three re-checks pass: nothing is sent, nothing is closed

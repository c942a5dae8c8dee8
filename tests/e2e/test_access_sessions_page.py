"""The dashboard's Sessions page (docs/ACCESS.md, "Audit and limits"), in
headless Chromium against the real stack: an admin sees a member's live
session into a running job and ends it.

Dana (admin) makes a team workspace and invites ellen as a member. Ellen runs
a job there and opens a terminal session into it through the API and the
relay's websocket, as the CLI would. Ellen's Sessions page lists it with her
End button; dana's lists it too (who, the run and job, kind, from where, bytes
each way). Dana ends it: the row says ended and why, and ellen's websocket
gets the reason and closes with 4410. The page passes the accessibility audit;
a screenshot goes to ``test-artifacts/screenshots/sessions.png``.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import websockets
from playwright.sync_api import Browser, BrowserContext, expect

from tests.e2e.conftest import FINISHED, User, commit_all, make_repo, run_name_of
from tests.e2e.test_dashboard import (
    DANA,
    ELLEN,
    make_token,
    nav_to,
    new_context,
    screenshot,
    sign_in,
)
from tests.support.accessibility import audit
from tests.support.github import GithubServer
from tests.support.stack import Stack

WORKFLOW = """
  - name: shell-host
    provider: bash
    commands:
      - sleep 900
"""
TEAM = "Sessions team"


@pytest.fixture
def contexts(browser: Browser, stack: Stack) -> Iterator[list[BrowserContext]]:
    opened: list[BrowserContext] = []
    yield opened
    for context in opened:
        context.close()


class HeldSession:
    """A session's client end held open in a thread, as ``trainyard ssh-proxy``
    holds one: it types a line, then reads until the server closes."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.ready = threading.Event()
        self.closed = threading.Event()
        self.output = bytearray()
        self.messages: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self.close_reason = ""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._hold()), daemon=True)

    def start(self) -> HeldSession:
        self._thread.start()
        assert self.ready.wait(60), "the session's websocket never said ready"
        return self

    async def _hold(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with websockets.connect(self.url, additional_headers=headers) as ws:
            try:
                while True:
                    frame = await ws.recv()
                    if isinstance(frame, bytes):
                        self.output += frame
                        continue
                    message = json.loads(frame)
                    self.messages.append(message)
                    if message == {"type": "ready"}:
                        await ws.send(b"echo typed-$((6 * 7))\n")
                        self.ready.set()
            except websockets.ConnectionClosed as closed:
                self.close_code = closed.rcvd.code if closed.rcvd else None
                self.close_reason = closed.rcvd.reason if closed.rcvd else ""
            finally:
                self.ready.set()
                self.closed.set()

    def wait_for_output(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output.decode(errors="replace"):
            assert time.monotonic() < deadline, f"{text!r} not seen in the session: {bytes(self.output)!r}"
            time.sleep(0.1)


def test_an_admin_sees_a_members_live_session_and_ends_it(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    # Dana makes a team workspace and invites ellen as a member.
    contexts.append(new_context(browser, stack))
    page = contexts[-1].new_page()
    sign_in(page, stack_github, DANA)
    dana = User("dana", make_token(page, "sessions-admin"), stack)
    page.get_by_role("combobox", name="Workspace").select_option(label="+ New team workspace…")
    page.get_by_label("Name", exact=True).fill(TEAM)
    page.get_by_role("button", name="Create workspace").click()
    expect(page.get_by_role("heading", name="Members")).to_be_visible()
    team = urlsplit(page.url).path.split("/")[2]
    invite = page.get_by_role("form", name="Invite a member")
    invite.get_by_label("GitHub username or email").fill("ellen")
    invite.get_by_role("combobox").select_option("member")
    invite.get_by_role("button", name="Invite").click()
    expect(page.get_by_text("@ellen").or_(page.get_by_role("cell", name="ellen", exact=True)).first).to_be_visible()

    # Ellen signs in (taking up the invitation), runs a job in the team workspace and opens a terminal into it.
    contexts.append(new_context(browser, stack))
    ellen_page = contexts[-1].new_page()
    sign_in(ellen_page, stack_github, ELLEN)
    ellen = User("ellen", make_token(ellen_page, "sessions-member"), stack)
    name = _running_job(ellen, team, tmp_path)
    try:
        granted = ellen.api(
            "POST",
            f"/api/v1/workspaces/{team}/runs/{name}/sessions/",
            json={"kind": "terminal", "client": "cli terminal"},
        )
        assert granted.status_code == 201, granted.text
        grant = granted.json()
        held = HeldSession(f"{stack.ws_url}/ws/v1/relay/{grant['id']}/", grant["token"]).start()
        held.wait_for_output("typed-42")

        # Ellen's own Sessions page lists it, with her End button.
        ellen_page.get_by_role("combobox", name="Workspace").select_option(team)
        nav_to(ellen_page, "Sessions")
        expect(ellen_page.get_by_role("heading", name="Sessions")).to_be_visible()
        ellens_row = ellen_page.get_by_role("row").filter(has_text="cli terminal")
        expect(ellens_row.get_by_role("button", name="End")).to_be_visible()
        audit(ellen_page)

        # Dana's lists it: who, the run and job, kind, from where, its state and bytes.
        page.goto(f"/w/{team}/runs")
        nav_to(page, "Sessions")
        expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
        row = page.get_by_role("row").filter(has=page.get_by_role("link", name=f"{name} / shell-host"))
        expect(row).to_have_count(1)
        cells = row.get_by_role("cell")
        expect(cells.nth(0)).to_have_text("ellen")
        expect(cells.nth(2)).to_have_text(str(grant["attempt"]))
        expect(cells.nth(3)).to_have_text("terminal")
        expect(cells.nth(4)).to_contain_text("cli terminal")
        expect(cells.nth(4)).to_contain_text(re.compile(r"127\.0\.0\.1|::1"))
        expect(cells.nth(6)).to_have_text("open")
        expect(cells.nth(7)).to_have_text(re.compile(r"↓ [1-9][\d.]* (B|KB)\s*↑ [1-9][\d.]* B"), timeout=60_000)
        expect(cells.nth(5).locator("time")).to_have_attribute("title", re.compile(r"\d"))
        audit(page)
        shot = screenshot(page, "sessions")
        print(f"look at {shot}")

        # Dana ends it: the row says so, and ellen's socket is told why and closed with 4410.
        row.get_by_role("button", name="End").click()
        row.get_by_role("button", name="End ellen's terminal session").click()
        expect(cells.nth(6)).to_have_text("ended")
        expect(row).to_contain_text("ended by an admin (dana)")
        expect(row.get_by_role("button", name="End")).to_have_count(0)
        audit(page)
        screenshot(page, "sessions-ended")
        assert held.closed.wait(30), "ellen's session was not closed"
        assert (held.close_code, held.close_reason) == (4410, "ended by an admin (dana)")
        assert {"type": "end", "reason": "ended by an admin (dana)"} in held.messages

        # Shown ended, with why, once the ended ones are asked for; the live list no longer holds it.
        page.get_by_role("checkbox", name="Show ended").check()
        expect(page.get_by_role("columnheader", name="End reason")).to_be_visible()
        expect(row).to_contain_text("ended by an admin (dana)")
        live = ellen.api("GET", f"/api/v1/workspaces/{team}/sessions/?live=1").json()
        assert [s for s in live if s["id"] == grant["id"]] == []
    finally:
        stopped = dana.api("POST", f"/api/v1/workspaces/{team}/runs/{name}/stop/")
        assert stopped.status_code == 202, stopped.text


def _running_job(user: User, workspace: str, tmp_path: Path) -> str:
    repo = make_repo(tmp_path / "shell-host")
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + WORKFLOW)
    commit_all(repo, "a job to open sessions in")
    submitted = user.cli(repo, "run", "shell-host", "-d", env={"TRAINYARD_WORKSPACE": workspace})
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)
    deadline = time.monotonic() + 120
    while True:
        run = user.api("GET", f"/api/v1/workspaces/{workspace}/runs/{name}/").json()
        if run["jobs"][0]["status"] == "running" or run["status"] in FINISHED or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert run["jobs"][0]["status"] == "running", run
    return name

"""The terminal in the browser (docs/ACCESS.md, "Terminal in the browser"), in
headless Chromium against the real stack: a local runner serves a login shell
on a PTY through the relay, the page is xterm.js on the relay's client end.

A member opens the Terminal tab of a running job and types; the shell runs in
the job's working directory with its variables; colours, wide characters,
paste and copy work. Resizing the window resizes the PTY (``stty size``). The
page reaches the server through a fault-injecting proxy
(tests/support/faultproxy.py): every connection is reset and held away for a
while, the page says it is reconnecting, and then it is back in the same shell
(a variable set before the drop is still set, the shell's pid is the same),
and so is it after a reload of the page. A second terminal is a second shell.
Another signed-in person cannot attach to those sessions. Closing a terminal
ends its session; stopping the run ends the other with a message in it; both
are in the audit trail with their bytes. The page passes the accessibility
audit with terminals open; screenshots go to ``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route, expect

from tests.e2e.conftest import FINISHED, User, commit_all, make_repo, run_name_of
from tests.e2e.test_dashboard import (
    AVATAR_SVG,
    TIMEOUT_MS,
    VIEWPORT,
    make_token,
    screenshot,
    sign_in,
)
from tests.support.accessibility import audit, serve_axe
from tests.support.faultproxy import FaultProxy
from tests.support.github import GithubServer, GithubUser
from tests.support.stack import Stack

# People of this file's own on the shared stack (tests/core/test_parallel_workers.py).
TESS = GithubUser(id=5101, login="tess", name="Tess Ochoa")
UMA = GithubUser(id=5102, login="uma", name="Uma Reyes")

WORKFLOW = """
  - name: shell-host
    provider: bash
    commands:
      - echo "workdir=$(pwd)"
      - sleep 900
"""
HELD_AWAY_SECONDS = 3  # long enough to see "reconnecting…", well inside the 30 s grace
SIZE = re.compile(r"size=(\d+) (\d+)")


@pytest.fixture
def proxy(stack: Stack) -> Iterator[FaultProxy]:
    running = FaultProxy(stack.port).start()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def contexts(browser: Browser, stack: Stack, proxy: FaultProxy) -> Iterator[Callable[[], BrowserContext]]:
    """Fresh profiles that reach the stack directly and through ``proxy``
    (cookies are per host, not per port: one sign-in serves both); the
    clipboard is the page's to read and write."""
    opened: list[BrowserContext] = []
    ours = {urlsplit(stack.url).netloc, urlsplit(proxy.url).netloc}

    def outside(route: Route) -> None:
        url = urlsplit(route.request.url)
        if url.netloc in ours or url.scheme in {"data", "blob"}:
            route.fallback()
        elif url.hostname == "avatars.example.test":
            route.fulfill(status=200, content_type="image/svg+xml", body=AVATAR_SVG)
        else:
            route.abort()

    def open_one() -> BrowserContext:
        context = browser.new_context(viewport=VIEWPORT, base_url=stack.url)
        opened.append(context)
        context.set_default_timeout(TIMEOUT_MS)
        context.grant_permissions(["clipboard-read", "clipboard-write"])
        context.route("**/*", outside)
        serve_axe(context)
        return context

    try:
        yield open_one
    finally:
        for context in opened:
            context.close()


class Term:
    """The terminal shown on the page, as a person sees and types into it."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.section = page.locator("section.terminal-session:not([hidden])")
        self.state = self.section.locator(".terminal-state")

    def text(self) -> str:
        """The screen and what scrolled off it, one line per row."""
        rows = self.section.locator(".xterm-rows > div").all_text_contents()
        return "\n".join(row.replace("\xa0", " ").rstrip() for row in rows)

    def type(self, line: str) -> None:
        self.section.locator(".xterm-screen").click()
        self.page.keyboard.type(line)
        self.page.keyboard.press("Enter")

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = list(re.finditer(pattern, self.text()))
            if found:
                return found[-1]
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} did not show in the terminal within {timeout}s:\n{self.text()}")
            time.sleep(0.1)

    def ask(self, command: str, answer: str) -> re.Match[str]:
        """Type ``command``, which prints ``answer``'s pattern after a fresh marker; its last match."""
        marker = f"mark{time.monotonic_ns()}"
        self.type(f"echo {marker}; {command}")
        return self.wait_for(rf"(?m)^{marker}\n(?:.*\n)*?.*{answer}")


def test_a_member_types_in_a_terminal_resizes_it_reconnects_to_the_same_shell_and_opens_another(
    stack: Stack,
    stack_github: GithubServer,
    contexts: Callable[[], BrowserContext],
    proxy: FaultProxy,
    tmp_path: Path,
) -> None:
    page = contexts().new_page()
    sign_in(page, stack_github, TESS)
    tess = User("tess", make_token(page, "terminal"), stack)
    name = _running_job(tess, tmp_path)
    try:
        _the_terminals_of(page, tess, name, proxy, contexts, stack_github)
    finally:
        tess.api("POST", f"/api/v1/workspaces/{tess.workspace}/runs/{name}/stop/")


def _the_terminals_of(
    page: Page,
    tess: User,
    name: str,
    proxy: FaultProxy,
    contexts: Callable[[], BrowserContext],
    stack_github: GithubServer,
) -> None:
    workdir = _logged_workdir(tess, name)

    # 1. Through the proxy, the run page's Terminal tab opens a shell in the job.
    page.goto(f"{proxy.url}/w/{tess.workspace}/runs/{name}")
    page.get_by_role("tab", name="Terminal").click()
    term = Term(page)
    expect(term.state).to_have_text("Connected")
    term.type('echo "run=$TRAINYARD_RUN_NAME"; pwd')
    term.wait_for(rf"(?m)^run={re.escape(name)}$")
    # The path is wider than the terminal: its rows are read as one line.
    assert f"run={name}{workdir}" in term.text().replace("\n", ""), term.text()

    # Colours, wide characters, and a pid to know the shell by.
    term.type("printf '\\033[31mred-text\\033[0m 日本語 ✓\\n'; echo \"pid=$$\"")
    term.wait_for(r"(?m)^red-text 日本語 ✓$")
    red = term.section.locator(".xterm-rows span", has_text=re.compile(r"^red-text$")).first
    r, g, b = _rgb(red.evaluate("e => getComputedStyle(e).color"))
    assert r > 180 and r > g + 60 and r > b + 60, f"red text is drawn rgb({r}, {g}, {b})"
    pid = term.wait_for(r"(?m)^pid=(\d+)$").group(1)

    # A flood of output arrives whole and in order.
    started = time.monotonic()
    term.type("seq 1 100000; echo flood-done")
    term.wait_for(r"(?m)^99999\n100000\nflood-done$", timeout=60)
    print(f"100,000 lines through the terminal in {time.monotonic() - started:.1f}s")

    # 2. Paste (Ctrl+Shift+V) and copy (a selection, Ctrl+Shift+C) with the clipboard.
    page.evaluate("navigator.clipboard.writeText('echo pasted-$((6 * 7))')")
    term.section.locator(".xterm-screen").click()
    page.keyboard.press("Control+Shift+V")
    page.keyboard.press("Enter")
    term.wait_for(r"(?m)^pasted-42$")
    term.section.locator(".xterm-rows span", has_text=re.compile(r"^pasted-42$")).last.dblclick(
        force=True
    )  # where the person sees it: the screen above takes the click
    page.keyboard.press("Control+Shift+C")
    assert page.evaluate("navigator.clipboard.readText()") == "pasted-42"

    # 3. A bigger window: a bigger terminal, and the PTY says so.
    rows_before, cols_before = (int(n) for n in term.ask('echo "size=$(stty size)"', SIZE.pattern).groups()[-2:])
    assert rows_before == term.section.locator(".xterm-rows > div").count()
    page.set_viewport_size({"width": 1600, "height": 1000})
    rows, cols = _size_once_changed(term, (rows_before, cols_before))
    assert rows > rows_before and cols > cols_before, ((rows_before, cols_before), (rows, cols))
    assert rows == term.section.locator(".xterm-rows > div").count()

    # 4. Every connection reset and held away: "reconnecting…", then the same shell.
    term.type("export KEPT=before-the-drop")
    time.sleep(0.5)
    proxy.blackhole()
    proxy.reset()
    expect(term.state).to_contain_text("reconnecting…")
    expect(page.get_by_role("tab", name=re.compile(r"reconnecting…"))).to_be_visible()
    screenshot(page, "terminal-reconnecting")
    time.sleep(HELD_AWAY_SECONDS)
    proxy.passthrough()
    expect(term.state).to_have_text("Connected")
    term.ask('echo "kept=$KEPT pid=$$"', rf"kept=before-the-drop pid={pid}")

    # A reload of the page reattaches to the same shell as well.
    page.reload()
    expect(term.state).to_have_text("Connected")
    expect(page.get_by_role("tab", name=re.compile(r"^shell-host"))).to_have_count(1)
    term.ask('echo "again=$KEPT pid=$$"', rf"again=before-the-drop pid={pid}")

    # Tab is the shell's; Ctrl+F6 moves the keyboard out of the terminal, to its toolbar.
    term.section.locator(".xterm-screen").click()
    page.keyboard.press("Control+F6")
    expect(page.get_by_role("button", name="Close terminal shell-host 1")).to_be_focused()

    # 5. A second terminal is a second shell; the first keeps its screen.
    page.get_by_role("button", name="New terminal in shell-host").click()
    expect(page.get_by_role("tab", name="shell-host 2")).to_have_attribute("aria-selected", "true")
    second = Term(page)
    expect(second.state).to_have_text("Connected")
    other = second.ask('echo "kept=${KEPT:-unset} pid=$$"', r"kept=unset pid=(\d+)").group(1)
    assert other != pid
    page.get_by_role("tab", name="shell-host 1").click()
    assert "again=before-the-drop" in Term(page).text()
    audit(page)
    shot = screenshot(page, "terminal")
    print(f"look at {shot}")

    # 6. Another person, signed in, cannot attach to tess's sessions; tess's shell carries on.
    live = _sessions(tess, name, live=True)
    assert [(s["kind"], s["client_label"], s["state"]) for s in live] == [("terminal", "browser terminal", "open")] * 2
    uma = contexts().new_page()
    sign_in(uma, stack_github, UMA)
    for session in live:
        code = uma.evaluate(_CLOSE_CODE_OF, f"/ws/v1/relay/{session['id']}/")
        assert code == 4401, code
    term.ask('echo "still=$KEPT"', r"still=before-the-drop")

    # 7. Closing a terminal ends its session; stopping the run ends the other, saying so.
    page.get_by_role("tab", name="shell-host 2").click()
    page.get_by_role("button", name="Close terminal shell-host 2").click()
    expect(page.get_by_role("tab", name=re.compile(r"^shell-host"))).to_have_count(1)
    closed = _until(lambda: [s for s in _sessions(tess, name) if s["state"] == "ended"], "the closed session's end")
    assert [s["end_reason"] for s in closed] == ["ended by its user (tess)"], closed
    assert tess.api("POST", f"/api/v1/workspaces/{tess.workspace}/runs/{name}/stop/").status_code == 202
    expect(term.state).to_contain_text("Session ended:", timeout=60_000)
    term.wait_for(r"session ended: the job is being stopped \(stopped by tess\)")
    screenshot(page, "terminal-ended")

    # Both are in the audit trail with what went each way.
    ended = _until(lambda: _all_ended(tess, name), "both sessions' ends")
    assert len(ended) == 2 and all(s["bytes_up"] > 0 and s["bytes_down"] > 0 for s in ended), ended


# ------------------------------------------------------------------ helpers


def _running_job(user: User, tmp_path: Path) -> str:
    repo = make_repo(tmp_path / "shell-host")
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + WORKFLOW)
    commit_all(repo, "a job to open terminals in")
    submitted = user.cli(repo, "run", "shell-host", "-d")
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)
    run = user.wait(name, lambda r: r["jobs"][0]["status"] == "running" or r["status"] in FINISHED, timeout=120)
    assert run["jobs"][0]["status"] == "running", run
    return name


def _logged_workdir(user: User, name: str) -> str:
    """The working directory the job's own commands see (its first log line)."""
    job = user.run(name)["jobs"][0]["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        raw = user.api("GET", f"/api/v1/workspaces/{user.workspace}/jobs/{job}/logs/raw").text
        if found := re.search(r"(?m)^workdir=(.+)$", raw):
            return found.group(1)
        time.sleep(0.3)
    raise AssertionError(f"job of {name} did not print its working directory")


def _size_once_changed(term: Term, before: tuple[int, int]) -> tuple[int, int]:
    """``stty size`` as (rows, cols), asked until it differs from ``before`` (the resize is sent as the page refits)."""
    deadline = time.monotonic() + 20
    while True:
        found = term.ask('echo "size=$(stty size)"', SIZE.pattern)
        rows, cols = int(found.group(1)), int(found.group(2))
        if (rows, cols) != before or time.monotonic() > deadline:
            return rows, cols
        time.sleep(0.5)


_CLOSE_CODE_OF = """(path) => new Promise((resolve) => {
  const socket = new WebSocket(location.origin.replace("http", "ws") + path);
  socket.onclose = (event) => resolve(event.code);
})"""


def _sessions(user: User, run: str, *, live: bool = False) -> list[dict[str, Any]]:
    """``user``'s sessions into ``run``, oldest first."""
    query = "?live=1" if live else ""
    listed = user.api("GET", f"/api/v1/workspaces/{user.workspace}/sessions/{query}").json()
    return sorted((s for s in listed if s["run"] == run), key=lambda s: s["created_at"])


def _all_ended(user: User, run: str) -> list[dict[str, Any]] | None:
    listed = _sessions(user, run)
    return listed if listed and all(s["state"] == "ended" for s in listed) else None


def _until(found: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := found()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout}s")
        time.sleep(0.2)
    return value


def _rgb(css: str) -> tuple[int, int, int]:
    r, g, b = (int(part) for part in re.findall(r"\d+", css)[:3])
    return r, g, b

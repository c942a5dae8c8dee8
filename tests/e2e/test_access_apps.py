"""A job's port in a real browser (Debian's Chromium), through the apps
proxy and the relay, on an origin of its own.

A person signs in, runs a job that serves a page and a websocket echo on
PORT_0 (Python's own http.server, with a small websocket echo), and opens the port from the run page: the page loads on
``<app>.apps.localhost`` (never the dashboard's origin), its websocket
round-trips, and neither the page nor the job sees a dashboard cookie or the
app's pass (the job reports the headers it got). A port nothing listens on
gets a page that says so. The one-time link does not
work twice, a browser without the pass is refused, and signing out of the
dashboard closes the app.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from playwright.sync_api import Browser, BrowserContext, Route, expect

from tests.e2e.conftest import User, commit_all, make_repo, run_name_of
from tests.e2e.test_dashboard import TIMEOUT_MS, VIEWPORT, make_token, sign_in
from tests.support.accessibility import serve_axe
from tests.support.github import GithubServer, GithubUser
from tests.support.stack import Stack

KIM = GithubUser(id=5101, login="kim", name="Kim Wexler")
APP = """
import base64, hashlib, json, os, struct
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAGE = b\"\"\"<!doctype html><html lang=en><meta charset=utf-8><title>Job app</title>
<h1>Served by the job</h1><p id=ws>connecting</p>
<script>
const s = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/echo");
s.onopen = () => s.send("ping");
s.onmessage = (e) => { document.getElementById("ws").textContent = e.data; };
s.onclose = (e) => { const p = document.getElementById("ws"); if (p.textContent === "connecting") p.textContent = "closed " + e.code; };
</script></html>\"\"\"
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the proxy may reuse its connection
    disable_nagle_algorithm = True  # as web servers do: a response's head and body are not held for an ACK

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.echo()
        if self.path == "/headers":
            body, kind = json.dumps([[k.lower(), v] for k, v in self.headers.items()]).encode(), "application/json"
        else:
            body, kind = PAGE, "text/html; charset=utf-8"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "job=1; Path=/; Domain=apps.localhost")
        self.end_headers()
        self.wfile.write(body)

    def echo(self):
        key = self.headers["Sec-WebSocket-Key"] + GUID
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, size = head[0] & 0x0F, head[1] & 0x7F
            if size == 126:
                size = struct.unpack(">H", self.rfile.read(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(size)))
            if opcode == 8:
                self.wfile.write(b"\\x88\\x00")
                return
            reply = b"echo: " + data
            length = bytes([len(reply)]) if len(reply) < 126 else b"\\x7e" + struct.pack(">H", len(reply))
            self.wfile.write(b"\\x81" + length + reply)
            self.wfile.flush()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT_0"])), App)
print("app listening", flush=True)
server.serve_forever()
"""
WORKFLOW = """
  - name: app
    provider: bash
    ports: 2
    commands:
      - python app.py
"""


def apps_context(browser: Browser, stack: Stack) -> BrowserContext:
    """A fresh profile that reaches only the stack and its apps (``*.apps.localhost`` on its port)."""
    context = browser.new_context(viewport=VIEWPORT, base_url=stack.url)
    context.set_default_timeout(TIMEOUT_MS)

    def only_the_stack(route: Route) -> None:
        url = urlsplit(route.request.url)
        ours = url.port == stack.port and (url.hostname == "127.0.0.1" or str(url.hostname).endswith(".apps.localhost"))
        route.fallback() if ours or url.scheme == "data" else route.abort()

    context.route("**/*", only_the_stack)
    serve_axe(context)  # registered last, so it answers before ``only_the_stack``
    return context


def test_a_member_opens_a_jobs_port_on_its_own_origin_and_its_websocket_round_trips(
    stack: Stack,
    stack_github: GithubServer,
    browser: Browser,
    contexts: list[BrowserContext],
    tmp_path: Path,
) -> None:
    context = apps_context(browser, stack)
    contexts.append(context)
    page = context.new_page()
    sign_in(page, stack_github, KIM)
    kim = User("kim", make_token(page, "apps"), stack)
    repo = _app_repo(tmp_path)
    name = run_name_of(kim.cli(repo, "run", "app", "-d"))
    port, idle = _listening(kim, name)

    # 1. The run page's Open link; the app opens in a new tab on its own origin.
    entered: list[str] = []
    context.on("request", lambda r: entered.append(r.url) if "/_trainyard/enter" in r.url else None)
    page.goto(f"/w/{kim.workspace}/runs/{name}")
    with context.expect_page() as opened:
        page.get_by_role("link", name=f"Open port {port} of app in a new tab").click()
    app = opened.value
    expect(app.get_by_role("heading", name="Served by the job")).to_be_visible()
    expect(app.locator("#ws")).to_have_text("echo: ping")
    where = urlsplit(app.url)
    assert str(where.hostname).endswith(".apps.localhost") and (where.port, where.path) == (stack.port, "/")
    origin = f"{where.scheme}://{where.netloc}"

    # 2. No dashboard cookie and no pass, neither in the page nor at the job.
    assert {c["name"] for c in context.cookies(stack.url)} >= {"sessionid", "csrftoken"}
    assert app.evaluate("document.cookie") == "job=1"
    seen: list[list[str]] = app.evaluate(
        "fetch('/headers', {headers: {'X-Real-IP': '198.51.100.7', Forwarded: 'for=198.51.100.7'}})"
        ".then((r) => r.json())"
    )
    headers = dict(seen)
    assert [v for k, v in seen if k == "cookie"] == ["job=1"]
    assert "x-real-ip" not in headers and "forwarded" not in headers and headers["x-forwarded-for"] == "127.0.0.1"
    assert (headers["host"], headers["x-forwarded-proto"], headers["x-forwarded-host"]) == (
        where.netloc,
        "http",
        where.netloc,
    )
    timing = app.evaluate(
        "async () => { const t = performance.now();"
        " for (let i = 0; i < 20; i++) await (await fetch('/headers')).text();"
        " return (performance.now() - t) / 20; }"
    )
    print(f"apps proxy: {timing:.1f} ms a request, 20 sequential requests of one page")
    sessions = kim.api("GET", f"/api/v1/workspaces/{kim.workspace}/sessions/").json()
    streams = [s for s in sessions if s["kind"] == "port"]
    assert {(s["user"], s["port"], s["client_label"]) for s in streams} == {("kim", port, "app proxy")}
    assert len(streams) <= 4, streams  # 23 requests and a websocket: a finished stream carries the next request

    # 3. A port nothing listens on (PORT_1) opens to a page that says so.
    with context.expect_page() as opened:
        page.get_by_role("link", name=f"Open port {idle} of app in a new tab").click()
    nothing = opened.value
    expect(nothing.get_by_role("heading", name="Nothing is listening")).to_be_visible()
    assert f"Nothing is listening on port {idle} in job app of run {name}" in nothing.content()

    # 4. The one-time link twice, a browser without the pass, a signed-out dashboard.
    replay = app.goto(entered[0])
    assert replay is not None and replay.status == 403
    expect(app.get_by_role("heading", name="This link has expired")).to_be_visible()
    stranger = apps_context(browser, stack)
    contexts.append(stranger)
    refused = stranger.new_page().goto(f"{origin}/")
    assert refused is not None and refused.status == 403 and "opens only from the Trainyard dashboard" in refused.text()
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    time.sleep(2.5)  # the proxy re-checks a pass at most every 2 s
    closed = app.goto(f"{origin}/")
    assert closed is not None and closed.status == 403
    assert "signed out: the session has ended" in closed.text()

    assert kim.cli(repo, "stop", name).returncode == 0


def _app_repo(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "tiny-train")
    (repo / "app.py").write_text(APP)
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + WORKFLOW)
    commit_all(repo, "a web app on PORT_0")
    return repo


def _listening(user: User, run: str) -> tuple[int, int]:
    """The job's PORT_0, once its app listens (its log says so), and its PORT_1 (nothing listens there)."""

    seen: dict[str, Any] = {}

    def listening() -> tuple[int, int] | None:
        job = seen["job"] = user.run(run)["jobs"][0]
        logs = user.api("GET", f"/api/v1/workspaces/{user.workspace}/jobs/{job['id']}/logs/").json()
        texts = seen["lines"] = [str(line["text"]) for line in logs.get("lines", [])]
        if job["status"] != "running" or not job.get("ports"):
            return None
        return (int(job["ports"][0]), int(job["ports"][1])) if any("app listening" in t for t in texts) else None

    try:
        found: tuple[int, int] = _until(listening, "the job's app", timeout=120)
        return found
    except AssertionError as error:
        raise AssertionError(f"{error}; the job: {seen.get('job')}; its log: {seen.get('lines')}") from None


def _until(check: Any, what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")

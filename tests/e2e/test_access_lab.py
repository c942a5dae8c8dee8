"""``provider: lab`` end to end with a real local runner: JupyterLab is
installed into the workflow's environment (built once, then reused: only the
first test of a session pays for the download), serves on the job's first
free port with the token the server made for it, and nothing else opens it.
In real Chromium, the link ``trainyard run lab`` prints opens JupyterLab
through the apps proxy on an origin of its own, with its token sent for the
person; a kernel executes ``1+1`` over its websocket; the dashboard's cookies
never reach the app's origin.

The examples/lab workflow is what runs (the README's `trainyard run lab --open`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.e2e.conftest import TRAINYARD, User, commit_all, run_name_of
from tests.e2e.test_access_apps import apps_context
from tests.e2e.test_dashboard import make_token, sign_in
from tests.support.github import GithubServer, GithubUser
from tests.support.stack import Stack

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab"
# The first run downloads JupyterLab and its dependencies from the package index.
FIRST_BUILD_SECONDS = 600


LENA = GithubUser(id=5202, login="lena", name="Lena Park")


@dataclass
class SignedIn:
    """Lena, signed in to the dashboard in a browser profile that reaches
    only the stack and its apps, and her API token for the CLI. One per
    module: her workspace's environment, built by the first test, is
    reused by the next (environments are per workspace)."""

    user: User
    context: BrowserContext
    page: Page


@pytest.fixture(scope="module")
def lena(stack: Stack, stack_github: GithubServer, browser: Browser) -> Iterator[SignedIn]:
    context = apps_context(browser, stack)
    page = context.new_page()
    sign_in(page, stack_github, LENA)
    yield SignedIn(User("lena", make_token(page, "lab"), stack), context, page)
    context.close()


@pytest.fixture
def lab_repo(repo: Path) -> Path:
    shutil.copytree(EXAMPLE, repo, dirs_exist_ok=True)
    commit_all(repo, "the lab example")
    return repo


def start_lab(alice: User, repo: Path, workflow: str = "lab") -> tuple[str, dict[str, Any]]:
    """Run ``workflow`` detached; the run's name and its job once Jupyter answers on its port."""
    started = alice.cli(repo, "run", workflow, "--detach")
    assert started.returncode == 0, started.stderr
    name = run_name_of(started)
    return name, jupyter_up(alice, repo, name)


def jupyter_up(alice: User, repo: Path, name: str) -> dict[str, Any]:
    """The run's job once its Jupyter answers on its port (refusing a request without the token)."""
    run = alice.wait(name, lambda r: _job(r)["status"] == "running" and bool(_job(r)["ports"]), FIRST_BUILD_SECONDS)
    port = _job(run)["ports"][0]
    deadline = time.monotonic() + FIRST_BUILD_SECONDS
    while True:  # the environment is built after the job is accepted: Jupyter starts after it
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/status", timeout=5).status_code == 403:
                break
        except httpx.TransportError:
            pass
        current = _job(alice.run(name))
        assert current["status"] == "running", (current, alice.cli(repo, "logs", name).stdout)
        assert time.monotonic() < deadline, alice.cli(repo, "logs", name).stdout
        time.sleep(1)
    return _job(alice.run(name))


def stop(alice: User, repo: Path, name: str) -> dict[str, Any]:
    stopped = alice.cli(repo, "stop", name)
    assert stopped.returncode == 0, stopped.stderr
    return alice.wait(name, lambda r: r["status"] == "stopped", 120)


def _job(run: dict[str, Any]) -> dict[str, Any]:
    [job] = run["jobs"]
    return job


def test_a_lab_job_serves_jupyterlab_on_its_port_with_its_token_only(lena: SignedIn, lab_repo: Path) -> None:
    name, job = start_lab(lena.user, lab_repo)
    port = job["ports"][0]

    logs = lena.user.cli(lab_repo, "logs", name).stdout
    refused = httpx.get(f"http://127.0.0.1:{port}/api/status", timeout=10)
    wrong = httpx.get(f"http://127.0.0.1:{port}/api/status", headers={"Authorization": "token nope"}, timeout=10)
    final = stop(lena.user, lab_repo, name)

    assert job["dev_environment"] == {"kind": "lab", "inactivity_seconds": 1800, "app_port": port}
    assert "+ jupyterlab==4.6.6" in logs or "reused" in logs, logs
    assert "JupyterLab" in logs or "jupyterlab" in logs, logs
    assert (refused.status_code, wrong.status_code) == (403, 403)
    assert _job(final)["status_reason"] == "stopped by lena"


# A kernel's execute_request over Jupyter's websocket (its JSON form), from
# the page on the app's origin: its REST and websocket go through the proxy.
RUN_ONE_PLUS_ONE = """async () => {
  const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || "";
  const made = await fetch("/api/kernels", {method: "POST", headers: {"X-XSRFToken": xsrf}, body: "{}"});
  if (!made.ok) return "kernel: " + made.status + " " + await made.text();
  const kernel = await made.json();
  const scheme = location.protocol === "https:" ? "wss://" : "ws://";
  const ws = new WebSocket(`${scheme}${location.host}/api/kernels/${kernel.id}/channels?session_id=e2e`);
  return await new Promise((resolve) => {
    const id = "e2e-" + Math.random();
    ws.onopen = () => ws.send(JSON.stringify({
      channel: "shell", header: {msg_id: id, msg_type: "execute_request", username: "e2e", session: "e2e",
        version: "5.3", date: new Date().toISOString()},
      parent_header: {}, metadata: {}, buffers: [],
      content: {code: "1+1", silent: false, store_history: false, user_expressions: {}, allow_stdin: false},
    }));
    ws.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.parent_header.msg_id === id && message.msg_type === "execute_result") {
        resolve(message.content.data["text/plain"]);
        ws.close();
      }
    };
    ws.onclose = (event) => resolve("closed " + event.code);
    setTimeout(() => resolve("no answer"), 60000);
  });
}"""


def test_jupyterlab_opens_through_the_proxy_on_its_own_origin_and_a_kernel_runs(
    stack: Stack, lena: SignedIn, lab_repo: Path
) -> None:
    context, page = lena.context, lena.page

    # 1. `trainyard run lab --open` prints the link once JupyterLab runs, and opens it.
    url, follower = _printed_link(lena.user, lab_repo)
    name = urlsplit(url).path.split("/")[3]
    job = jupyter_up(lena.user, lab_repo, name)
    assert url == f"{stack.url}/open/{lena.user.workspace}/{name}/lab/{job['ports'][0]}/"

    # 2. The link opens JupyterLab on the app's own origin, its token sent for the person.
    sent: list[dict[str, str]] = []
    context.on("request", lambda r: sent.append({"url": r.url, **r.all_headers()}))
    page.goto(url)
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
    where = urlsplit(page.url)
    assert str(where.hostname).endswith(".apps.localhost") and where.port == stack.port, page.url
    assert page.title().startswith("JupyterLab") or "JupyterLab" in page.content()

    # 3. A kernel executes 1+1 over its websocket, through the proxy.
    assert page.evaluate(RUN_ONE_PLUS_ONE) == "2"

    # 4. The dashboard's cookies never reach the app's origin.
    dashboard = {c["name"] for c in context.cookies(stack.url)}
    assert dashboard >= {"sessionid", "csrftoken"}
    to_app = [r for r in sent if urlsplit(r["url"]).hostname == where.hostname]
    assert to_app, sent
    assert not [r["url"] for r in to_app if any(f"{n}=" in r.get("cookie", "") for n in dashboard)]
    assert not {c.split("=")[0].strip() for c in page.evaluate("document.cookie").split(";")} & dashboard

    follower.send_signal(signal.SIGINT)
    assert follower.wait(30) == 130  # Ctrl-C detaches from the run
    stop(lena.user, lab_repo, name)


def _printed_link(user: User, repo: Path) -> tuple[str, subprocess.Popen[str]]:
    """``trainyard run lab --open`` in the background, until it prints
    JupyterLab's link; the "browser" it opens (``$BROWSER``) records the link
    it was given, which must be the same."""
    opened = repo.parent / "opened.txt"
    recorder = repo.parent / "browser.sh"
    recorder.write_text(f'#!/bin/sh\necho "$1" >> {opened}\n')
    recorder.chmod(0o755)
    env = {
        **os.environ,
        "TRAINYARD_URL": user.stack.url,
        "TRAINYARD_TOKEN": user.token,
        "HOME": str(repo.parent),
        "BROWSER": f"{recorder} %s",
    }
    follower = subprocess.Popen(
        [str(TRAINYARD), "run", "lab", "--open"],
        cwd=repo,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert follower.stderr is not None
    said: list[str] = []
    deadline = time.monotonic() + FIRST_BUILD_SECONDS
    for line in follower.stderr:
        said.append(line)
        if line.startswith("lab: JupyterLab is at "):
            url = line.removeprefix("lab: JupyterLab is at ").strip()
            while not opened.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert opened.read_text().split() == [url]
            return url, follower
        assert time.monotonic() < deadline, said
    raise AssertionError(f"trainyard run lab ended without the link: {''.join(said)}")

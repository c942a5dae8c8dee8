"""`trainyard login` through the browser (a device code), named profiles,
`trainyard workspace ls/use` and the global `-w`, against the real stack.

The CLI runs as a user would start it: no TRAINYARD_TOKEN, a config folder
of its own, and a BROWSER that records the page it was asked to open. Felix
signs in with GitHub and makes an API token on the dashboard; a code is
approved through the API with that token, or on the dashboard's device page
in Chromium.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.conftest import TRAINYARD, User
from tests.e2e.test_dashboard import make_token, new_context, screenshot, sign_in
from tests.support.accessibility import audit
from tests.support.github import GithubServer, GithubUser
from tests.support.stack import Stack

FELIX = GithubUser(id=5301, login="felix", name="Felix Device")
CODE_LINE = re.compile(r"enter the code ([A-Z]{4}-[A-Z]{4})")


@pytest.fixture(scope="module")
def felix(stack: Stack, stack_github: GithubServer, browser: Browser) -> User:
    """Felix, signed in with GitHub, with an API token made on the dashboard."""
    context = new_context(browser, stack)
    try:
        page = context.new_page()
        sign_in(page, stack_github, FELIX)
        return User("felix", make_token(page, "device-tests"), stack)
    finally:
        context.close()


def cli_env(stack: Stack, home: Path, **extra: str) -> dict[str, str]:
    """A fresh user's environment: no token, no profile, a browser that writes down what it opens."""
    browser = home / "browser"
    if not browser.exists():
        home.mkdir(parents=True, exist_ok=True)
        browser.write_text(f'#!/bin/sh\necho "$1" >> {home / "opened"}\n')
        browser.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    return {
        **env,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "TRAINYARD_URL": stack.url,
        "BROWSER": str(browser),
        **extra,
    }


def trainyard(env: dict[str, str], *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TRAINYARD), *args], env=env, capture_output=True, text=True, timeout=120, input=input,
        stdin=None if input is not None else subprocess.DEVNULL, cwd=env["HOME"],
    )  # fmt: skip


def start_login(env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], str, list[str]]:
    """`trainyard login ARGS` started; its code, once printed, and the lines so far."""
    process = subprocess.Popen(
        [str(TRAINYARD), "login", *args], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=env["HOME"],
    )  # fmt: skip
    assert process.stderr is not None
    lines = _lines_until(process.stderr, CODE_LINE, process)
    found = CODE_LINE.search(lines[-1])
    assert found, lines
    return process, found.group(1), lines


def _lines_until(stream: IO[str], pattern: re.Pattern[str], process: subprocess.Popen[str]) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line and process.poll() is not None:
            break
        lines.append(line)
        if pattern.search(line):
            return lines
    raise AssertionError(f"`trainyard login` printed no code: {lines}")


def opened_by_the_browser(home: Path) -> str:
    """The page the CLI asked the browser to open (it asks right after printing the code)."""
    opened = home / "opened"
    deadline = time.monotonic() + 30
    while not opened.exists() or not opened.read_text().endswith("\n"):
        assert time.monotonic() < deadline, "the CLI opened no browser"
        time.sleep(0.05)
    return opened.read_text().strip()


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    """Its exit code and the rest of its stderr (from the buffer its code was read through)."""
    assert process.stderr is not None
    code = process.wait(timeout=60)  # it writes a few lines: the pipe cannot fill
    return code, process.stderr.read()


def test_login_in_the_browser_saves_a_profile_that_works(felix: User, tmp_path: Path) -> None:
    env = cli_env(felix.stack, tmp_path / "home")
    process, code, shown = start_login(env, "--profile", "lab")

    looked_up = felix.api("GET", f"/api/v1/auth/device/{code}/")
    approved = felix.api("POST", f"/api/v1/auth/device/{code}/approve/")
    exit_code, rest = finish(process)

    assert looked_up.status_code == 200 and looked_up.json()["client_name"].startswith("trainyard CLI on ")
    assert approved.status_code == 200 and approved.json()["state"] == "approved"
    assert exit_code == 0, "".join(shown) + rest
    assert f"{felix.stack.url}/device" in "".join(shown)
    assert (tmp_path / "home" / "opened").read_text().strip() == f"{felix.stack.url}/device?code={code}"
    assert "Logged in to" in rest and "as felix" in rest and "saved as profile 'lab'" in rest
    # The profile is the one saved; the default profile is untouched (there is none).
    path = tmp_path / "home" / "config" / "trainyard" / "config.json"
    saved = json.loads(path.read_text())["profiles"]
    assert list(saved) == ["lab"] and saved["lab"]["url"] == felix.stack.url
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # The token works through the profile, by the global option and by the variable.
    by_option = trainyard(env, "--profile", "lab", "workspace", "ls")
    by_variable = trainyard({**env, "TRAINYARD_PROFILE": "lab"}, "ps")
    without = trainyard(env, "ps")
    assert by_option.returncode == 0, by_option.stderr
    assert re.search(r"^\*\s+felix\s", by_option.stdout, re.M), by_option.stdout
    assert by_variable.returncode == 0, by_variable.stderr
    assert without.returncode == 1 and "no API token: run `trainyard login`" in without.stderr
    # A token of limited life, named for the device, one of Felix's.
    tokens = felix.api("GET", "/api/v1/tokens/").json()
    device_token = next(t for t in tokens if t["prefix"] == saved["lab"]["token"][:14])
    expires = datetime.fromisoformat(device_token["expires_at"].replace("Z", "+00:00"))
    assert device_token["name"].startswith("trainyard CLI on ")
    assert timedelta(days=29) < expires - datetime.now(UTC) <= timedelta(days=30)
    # The code is spent: it can be neither looked up nor approved again.
    assert felix.api("POST", f"/api/v1/auth/device/{code}/approve/").status_code == 404
    # Once the token's life is over, the CLI is told to sign in again.
    felix.stack.manage(
        "shell",
        "-c",
        "from django.utils import timezone; from backend.accounts.models import ApiToken;"
        f" ApiToken.objects.filter(pk={device_token['id']!r}).update(expires_at=timezone.now())",
    )
    expired = trainyard(env, "--profile", "lab", "ps")
    assert expired.returncode == 1
    assert "This API token expired at" in expired.stderr and "sign in again with `trainyard login`" in expired.stderr


def test_a_denied_code_ends_the_login_and_saves_nothing(felix: User, tmp_path: Path) -> None:
    env = cli_env(felix.stack, tmp_path / "home")
    process, code, _ = start_login(env, "--no-browser")

    denied = felix.api("POST", f"/api/v1/auth/device/{code.lower()}/deny/")
    exit_code, rest = finish(process)

    assert denied.status_code == 200 and denied.json()["state"] == "denied"
    assert exit_code == 1 and "error: The sign-in was denied on the dashboard." in rest
    assert not (tmp_path / "home" / "opened").exists()
    assert not (tmp_path / "home" / "config" / "trainyard" / "config.json").exists()


def test_without_a_display_the_login_only_prints_the_link(felix: User, tmp_path: Path) -> None:
    """In an ssh session Python's webbrowser would start a text browser in the
    terminal (here a `www-browser` on PATH): the CLI opens none."""
    home = tmp_path / "home"
    env = cli_env(felix.stack, home)
    for name in ("BROWSER", "DISPLAY", "WAYLAND_DISPLAY"):
        env.pop(name, None)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "www-browser").write_text(f'#!/bin/sh\necho "$1" >> {home / "opened"}\n')
    (bin_dir / "www-browser").chmod(0o755)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    process, code, shown = start_login(env)

    felix.api("POST", f"/api/v1/auth/device/{code}/deny/")
    exit_code, rest = finish(process)

    assert exit_code == 1 and "denied" in rest
    printed = "".join(shown) + rest
    assert f"(or open {felix.stack.url}/device?code={code})" in printed
    assert "Opened the sign-in page" not in printed
    assert not (home / "opened").exists()


def test_polling_is_answered_as_rfc_8628_says(felix: User) -> None:
    """Pending, then slow_down for a poll too soon (and a longer interval), expired once the code's time is up."""
    started = httpx.post(f"{felix.stack.url}/api/v1/auth/device/", json={"client_name": "a script"}, timeout=30)
    body = started.json()

    def poll() -> dict[str, object]:
        answer = httpx.post(
            f"{felix.stack.url}/api/v1/auth/device/token/", json={"device_code": body["device_code"]}, timeout=30
        )
        assert answer.status_code == 400, answer.text
        return answer.json()

    first, second = poll(), poll()
    felix.stack.manage(
        "shell",
        "-c",
        "from django.utils import timezone; from backend.accounts.models import DeviceLogin;"
        f" DeviceLogin.objects.filter(user_code={body['user_code'].replace('-', '')!r}).update(expires_at=timezone.now())",
    )
    expired = poll()
    approve_late = felix.api("POST", f"/api/v1/auth/device/{body['user_code']}/approve/")
    unknown = httpx.post(
        f"{felix.stack.url}/api/v1/auth/device/token/", json={"device_code": "tydev_nothing"}, timeout=30
    ).json()
    malformed = httpx.post(f"{felix.stack.url}/api/v1/auth/device/token/", json={}, timeout=30)
    unreadable = httpx.post(
        f"{felix.stack.url}/api/v1/auth/device/token/", content=b"\x00", headers={"Content-Type": "application/json"}
    )

    assert started.status_code == 201 and re.fullmatch(r"[B-Z]{4}-[B-Z]{4}", body["user_code"])
    assert body["interval"] == 5 and body["expires_in"] == 600
    assert body["verification_uri_complete"] == f"{felix.stack.url}/device?code={body['user_code']}"
    assert first["error"] == "authorization_pending" and first["interval"] == 5
    assert second["error"] == "slow_down" and second["interval"] == 10
    assert expired["error"] == "expired_token" and body["user_code"] in str(expired["message"])
    assert approve_late.status_code == 404 and "No sign-in is waiting for this code" in approve_late.text
    assert unknown["error"] == "invalid_grant"
    assert malformed.status_code == 400 and malformed.json() == {
        "error": "invalid_request",
        "message": "Invalid input: device_code: This field is required.",
    }
    assert unreadable.status_code == 400 and unreadable.json()["error"] == "invalid_request"


def test_workspace_use_and_the_global_w_choose_where_commands_act(felix: User, tmp_path: Path) -> None:
    """An old single-profile login file is read as the profile `default`;
    `workspace use` saves the choice in it; `-w` wins for one command."""
    team = felix.api("POST", "/api/v1/workspaces/", json={"name": "Felix Lab"}).json()["slug"]
    env = cli_env(felix.stack, tmp_path / "home")
    del env["TRAINYARD_URL"]
    path = tmp_path / "home" / "config" / "trainyard" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"url": felix.stack.url, "token": felix.token}))

    set_in_team = trainyard(env, "-w", team, "secrets", "set", "LAB_ONLY", input="s3cret\n")
    listed_before = trainyard(env, "workspace", "ls")
    used = trainyard(env, "workspace", "use", team)
    listed_after = trainyard(env, "workspace", "ls")
    in_team = trainyard(env, "secrets", "ls")
    in_personal = trainyard(env, "--workspace", "felix", "secrets", "ls")
    not_mine = trainyard(env, "workspace", "use", "someone-elses")

    assert set_in_team.returncode == 0, set_in_team.stderr
    team_secrets = felix.api("GET", f"/api/v1/workspaces/{team}/secrets/").json()
    personal_secrets = felix.api("GET", "/api/v1/workspaces/felix/secrets/").json()
    assert [s["name"] for s in team_secrets] == ["LAB_ONLY"] and personal_secrets == []
    assert re.search(r"^\*\s+felix\s", listed_before.stdout, re.M), listed_before.stdout
    assert used.returncode == 0 and f"Profile 'default' now acts in workspace {team}" in used.stderr
    assert re.search(rf"^\*\s+{team}\s+Felix Lab\s+admin", listed_after.stdout, re.M), listed_after.stdout
    assert "LAB_ONLY" in in_team.stdout and "LAB_ONLY" not in in_personal.stdout
    assert in_personal.returncode == 0, in_personal.stderr
    assert not_mine.returncode == 1 and "you are not a member of workspace 'someone-elses'" in not_mine.stderr
    saved = json.loads(path.read_text())
    assert saved == {"profiles": {"default": {"url": felix.stack.url, "token": felix.token, "workspace": team}}}


def test_login_with_a_token_keeps_working(felix: User, tmp_path: Path) -> None:
    env = cli_env(felix.stack, tmp_path / "home")
    logged_in = trainyard(env, "login", "--url", felix.stack.url, "--token", felix.token, "--profile", "ci")
    unknown_profile = trainyard(env, "--profile", "nope", "ps")

    assert logged_in.returncode == 0, logged_in.stderr
    assert "as felix (workspace felix)" in logged_in.stderr and "trainyard --profile ci" in logged_in.stderr
    assert trainyard({**env, "TRAINYARD_PROFILE": "ci"}, "ps").returncode == 0
    assert unknown_profile.returncode == 1
    assert "there is no profile 'nope'" in unknown_profile.stderr and "profiles: ci" in unknown_profile.stderr


def test_the_device_page_signs_the_cli_in_after_a_github_sign_in(
    stack: Stack, stack_github: GithubServer, browser: Browser, tmp_path: Path
) -> None:
    """The link the CLI opens, in a browser that is not signed in: GitHub's
    sign-in comes back to the device page with the code filled in; Approve."""
    env = cli_env(stack, tmp_path / "home")
    process, code, _ = start_login(env)
    opened = opened_by_the_browser(tmp_path / "home")
    context = new_context(browser, stack)
    try:
        page = context.new_page()
        stack_github.next_user = FELIX
        page.goto(opened)
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        page.get_by_role("button", name="Sign in with GitHub").click()
        expect(page.get_by_role("heading", name="Sign in a device")).to_be_visible()
        expect(page.get_by_role("heading", name=code)).to_be_visible()
        expect(page.get_by_text(re.compile(r"trainyard CLI on .* asks to sign in as felix"))).to_be_visible()
        audit(page)
        screenshot(page, "device-approve")
        page.get_by_role("button", name="Approve").click()
        expect(page.get_by_role("status").filter(has_text="is signed in as felix")).to_be_visible()
        audit(page)
        # A code typed by hand that is not waiting is refused on the page.
        page.goto("/device")
        page.get_by_label("Code", exact=True).fill("bcdf-ghjk")
        page.get_by_role("button", name="Continue").click()
        expect(page.get_by_role("alert")).to_contain_text("No sign-in is waiting for this code")
        audit(page)
    finally:
        context.close()
    exit_code, rest = finish(process)
    assert exit_code == 0 and "as felix" in rest, rest
    assert trainyard(env, "workspace", "ls").returncode == 0


def test_sign_in_by_github_elsewhere_is_unchanged(stack: Stack, stack_github: GithubServer, browser: Browser) -> None:
    """The sign-in page of `/` sends no `next`: GitHub's sign-in lands on the runs page as before."""
    context = new_context(browser, stack)
    try:
        page = context.new_page()
        sign_in(page, stack_github, FELIX)
        expect(page).to_have_url(re.compile(r"/w/felix/runs$"))
    finally:
        context.close()

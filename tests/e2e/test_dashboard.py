"""The web dashboard in a real browser (headless Chromium through Playwright),
against the real stack, signed in through the local GitHub stand-in.

A person signs in with GitHub, makes an API token on the tokens page, submits
a run with the CLI, watches it appear and its lines stream in without
reloading, tags it, previews and downloads an artifact, and signs out. A
viewer of a team workspace sees no Stop button, and the API refuses their
stop too. When a job's runner dies and the job runs again, the run page
shows both attempts: marks in the one log and a row each in its table.

The run page of a 5,000-line log is painted to the bottom (sidebar and
background) at 1280x800 and 1920x1080. The run page of a finished
200,000-line job opens at its last line and holds a bounded window of it;
scrolling to the top shows line 1 and a search finds a line far away. After each navigation every test runs
axe-core's WCAG 2 A and AA rules on the page (``audit``): a violation fails it.

Screenshots (full page, 1280x800 unless named otherwise) go to
``test-artifacts/screenshots/``. The browser is Debian's ``chromium`` (never
``playwright install``).
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import Browser, BrowserContext, Page, Route, expect

from tests.e2e.conftest import FINISHED, User, make_repo, run_name_of
from tests.e2e.test_lifecycle import _kill_the_runner_of, _sleeps
from tests.support.accessibility import audit, serve_axe
from tests.support.aws_account import BUCKET, prepare
from tests.support.github import GithubServer, GithubUser
from tests.support.logfill import NOISY_TEXT, fill_job_log
from tests.support.moto import MotoServer
from tests.support.screenshots import assert_background_reaches_the_bottom
from tests.support.stack import REPO_ROOT, Stack

VIEWPORT = {"width": 1280, "height": 800}
SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"
TIMEOUT_MS = 30_000
expect.set_options(timeout=TIMEOUT_MS)  # Playwright's default is 5 s; runs take longer on a busy machine

DANA = GithubUser(id=5001, login="dana", name="Dana Scully")
VIC = GithubUser(id=5002, login="vic", name="Vic Viewer")

WORKFLOWS = """\
workflows:
  - name: ticks
    provider: bash
    commands:
      - "for i in 1 2 3 4 5 6; do echo tick $i; sleep 1; done"
      - python download.py
    artifacts:
      - ./base_model

  - name: long
    provider: bash
    commands:
      - sleep 60

  - name: chatty
    provider: bash
    commands:
      - "seq -f 'line %.0f of 5000' 1 5000"

  - name: resumable
    provider: bash
    help: Survives the loss of its runner
    commands:
      - echo "attempt=$TRAINYARD_ATTEMPT"
      - if [ "$TRAINYARD_ATTEMPT" = 1 ]; then sleep $NAP & sleep $((NAP + 1)); fi
      - echo finished
"""
# What tiny-train's download.py writes: json.dumps({"w": 0.0, "b": 0.0}).
WEIGHTS = b'{"w": 0.0, "b": 0.0}'

# A stand-in avatar, so the page never reaches for the network.
AVATAR_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="16" fill="#8a8fd6"/>'
    '<circle cx="16" cy="12" r="6" fill="#fff"/><rect x="6" y="20" width="20" height="10" rx="5" fill="#fff"/></svg>'
)


# --- browser -----------------------------------------------------------------


def new_context(browser: Browser, stack: Stack) -> BrowserContext:
    """A fresh browser profile (no cookies): only the stack is reachable; avatars are stubbed."""
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True, base_url=stack.url)
    context.set_default_timeout(TIMEOUT_MS)
    stack_host = urlsplit(stack.url).netloc

    def outside(route: Route) -> None:
        url = urlsplit(route.request.url)
        if url.netloc == stack_host or url.scheme in {"data", "blob"}:
            route.fallback()
        elif url.hostname == "avatars.example.test":
            route.fulfill(status=200, content_type="image/svg+xml", body=AVATAR_SVG)
        else:
            route.abort()

    context.route("**/*", outside)
    serve_axe(context)  # registered last, so it answers before ``outside``
    return context


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


# --- what a person does ----------------------------------------------------------


def sign_in(page: Page, github: GithubServer, who: GithubUser) -> None:
    """Open the site, click "Sign in with GitHub"; the stand-in approves as ``who``.
    Both pages, the sign-in page and the first after it, pass the audit."""
    github.next_user = who
    page.goto("/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    audit(page)
    page.get_by_role("button", name="Sign in with GitHub").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    expect(page.locator(".user-name")).to_have_text(who.login)
    expect(page.locator(".loading")).to_have_count(0)
    audit(page)


def nav_to(page: Page, item: str) -> None:
    """A link of the sidebar's navigation (client-side: no reload)."""
    page.get_by_role("navigation", name="Workspace").get_by_role("link", name=item, exact=True).click()


def make_token(page: Page, name: str) -> str:
    """The "API tokens" page: create one and read it (shown once)."""
    nav_to(page, "API tokens")
    expect(page.get_by_role("heading", name="API tokens")).to_be_visible()
    page.get_by_label("Token name").fill(name)
    page.get_by_role("button", name="Create token").click()
    shown = page.get_by_test_id("new-token")
    expect(shown).to_have_text(re.compile(r"^trainyard_\S+$"))
    audit(page)
    return shown.inner_text().strip()


def open_run(page: Page, run_name: str) -> None:
    """The runs table's row for ``run_name`` appears (without reloading); open it."""
    link = page.get_by_role("link", name=run_name, exact=True)
    expect(link).to_be_visible()
    link.click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(run_name)
    audit(page)


def run_status(page: Page) -> str:
    return page.locator("header.run-header h1 .badge").get_attribute("data-status") or ""


def csrf_token(context: BrowserContext) -> str:
    return next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")


def tiny_repo(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "tiny-train")
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    return repo


# --- the tests ---------------------------------------------------------------------


def test_a_person_follows_a_run_tags_it_and_downloads_its_artifact(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    context = new_context(browser, stack)
    contexts.append(context)
    page = context.new_page()

    # 1. Sign in with GitHub → the empty runs page, with the three commands.
    sign_in(page, stack_github, DANA)
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    expect(page.get_by_role("heading", name="Start your first run")).to_be_visible()
    expect(page.get_by_text("trainyard run hello", exact=True)).to_be_visible()
    expect(page.get_by_text(f"export TRAINYARD_URL={stack.url}", exact=True)).to_be_visible()

    # 2. A token from the tokens page; a run submitted with it through the CLI.
    token = make_token(page, "laptop")
    dana = User("dana", token, stack)
    assert dana.api("GET", "/api/v1/me/").json()["username"] == "dana"
    nav_to(page, "Runs")
    expect(page.get_by_role("heading", name="Start your first run")).to_be_visible()
    url_before = page.url

    submitted = dana.cli(tiny_repo(tmp_path), "run", "ticks", "-d")
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)

    # 3. The row appears live (no reload), then the run's lines stream in.
    row = page.locator(f'tr[data-run="{name}"]')
    expect(row).to_be_visible()
    assert page.url == url_before
    expect(row).to_contain_text("ticks")
    expect(row).to_contain_text("dana")
    screenshot(page, "runs")
    open_run(page, name)
    log = page.get_by_role("log")
    expect(log).to_contain_text("tick 1", timeout=60_000)
    seen_first_at = time.monotonic()
    assert dana.run(name)["status"] == "running", "the first line should show while the job still runs"
    assert run_status(page) == "running"
    expect(log).not_to_contain_text("tick 6")
    expect(log).to_contain_text("tick 6")
    assert time.monotonic() - seen_first_at > 2, "the lines arrived all at once, not live"
    expect(log).to_contain_text("base model written to base_model/weights.json")
    expect(page.locator("header.run-header h1 .badge")).to_have_attribute("data-status", "succeeded", timeout=60_000)
    audit(page)
    screenshot(page, "run-detail-logs")

    # The log's Download is the raw log, named after the run and job.
    job = dana.run(name)["jobs"][0]
    with page.expect_download() as download_info:
        page.locator(".job-logs").get_by_role("link", name="Download", exact=True).click()
    saved = download_info.value
    raw = dana.api("GET", f"/api/v1/workspaces/{dana.workspace}/jobs/{job['id']}/logs/raw").content
    assert saved.suggested_filename == f"{name}-{job['name']}.log"
    assert Path(saved.path()).read_bytes() == raw
    assert b"tick 6\n" in raw and b"base model written to base_model/weights.json\n" in raw

    # 4. Tag it from the page; the API shows the tag.
    page.get_by_role("button", name="Tag", exact=True).click()
    page.get_by_label("Tag name").fill("dana-best")
    page.get_by_role("button", name="Save tag").click()
    expect(page.locator("header.run-header .tags")).to_contain_text("dana-best")
    tag = dana.api("GET", f"/api/v1/workspaces/{dana.workspace}/tags/dana-best/")
    assert tag.status_code == 200, tag.text
    assert tag.json()["run"] == name
    assert "dana-best" in dana.run(name)["tags"]

    # 5. Artifacts: preview weights.json, then download it.
    page.get_by_role("tab", name="Artifacts").click()
    expect(page.get_by_role("tab", name="Artifacts")).to_have_attribute("aria-selected", "true")
    page.get_by_role("button", name="weights.json").click()
    preview = page.get_by_role("region", name="Preview")
    # Re-indented, every literal exactly as the file has it (0.0 stays 0.0).
    expect(preview.locator("pre")).to_have_text('{\n  "w": 0.0,\n  "b": 0.0\n}')
    audit(page)
    screenshot(page, "artifacts")
    with page.expect_download() as download_info:
        preview.get_by_role("link", name="Download").click()
    download = download_info.value
    assert download.suggested_filename == "weights.json"
    saved = tmp_path / "downloaded-weights.json"
    download.save_as(saved)
    assert saved.read_bytes() == WEIGHTS
    listed = dana.api("GET", f"/api/v1/workspaces/{dana.workspace}/runs/{name}/artifacts/").json()
    files = {f["path"]: f for a in listed for f in a["files"]}
    assert files["weights.json"]["sha256"] == hashlib.sha256(WEIGHTS).hexdigest()

    # 7. Sign out → the sign-in page; the session no longer reaches the API.
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("button", name="Sign in with GitHub")).to_be_visible()
    page.reload()
    expect(page.get_by_role("button", name="Sign in with GitHub")).to_be_visible()
    audit(page)
    me = page.request.get("/api/v1/me/")
    assert me.status in {401, 403}, me.text()


def test_a_viewer_sees_no_stop_button_and_cannot_stop_a_run(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    # Dana makes a team workspace and invites vic (no account yet) as a viewer.
    admin = new_context(browser, stack)
    contexts.append(admin)
    page = admin.new_page()
    sign_in(page, stack_github, DANA)
    dana = User("dana", make_token(page, "team-ci"), stack)
    page.get_by_role("combobox", name="Workspace").select_option(label="+ New team workspace…")
    audit(page)
    page.get_by_label("Name", exact=True).fill("Vision team")
    page.get_by_role("button", name="Create workspace").click()
    expect(page.get_by_role("heading", name="Members")).to_be_visible()
    team = urlsplit(page.url).path.split("/")[2]
    assert team == "vision-team", page.url
    invite = page.get_by_role("form", name="Invite a member")
    invite.get_by_label("GitHub username or email").fill("vic")
    invite.get_by_role("combobox").select_option("viewer")
    invite.get_by_role("button", name="Invite").click()
    expect(page.get_by_role("heading", name="Pending invitations")).to_be_visible()
    expect(page.get_by_role("cell", name="@vic")).to_be_visible()
    audit(page)

    # A long run in the team workspace, submitted with dana's token.
    submitted = dana.cli(tiny_repo(tmp_path), "run", "long", "-d", env={"TRAINYARD_WORKSPACE": team})
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)
    run_path = f"/api/v1/workspaces/{team}/runs/{name}/"
    try:
        # Vic signs in in another browser (accepting the invitation) and opens it.
        viewer = new_context(browser, stack)
        contexts.append(viewer)
        vic_page = viewer.new_page()
        sign_in(vic_page, stack_github, VIC)
        vic_page.get_by_role("combobox", name="Workspace").select_option(team)
        expect(vic_page.locator(".role")).to_have_text("viewer")
        open_run(vic_page, name)
        expect(vic_page.locator("header.run-header h1 .badge")).to_have_attribute(
            "data-status", "running", timeout=60_000
        )
        expect(vic_page.get_by_role("button", name="Re-run")).to_have_count(0)
        expect(vic_page.get_by_role("button", name="Stop")).to_have_count(0)
        expect(vic_page.get_by_role("button", name="Tag", exact=True)).to_have_count(0)
        audit(vic_page)

        # The API refuses vic's stop, sent the way the page would send it. (The
        # session and CSRF header do work: the same request makes vic a token.)
        csrf = {"X-CSRFToken": csrf_token(viewer)}
        refused = vic_page.request.post(f"{run_path}stop/", headers=csrf)
        assert refused.status == 403, refused.text()
        assert "csrf" not in refused.text().lower(), refused.text()
        own = vic_page.request.post("/api/v1/tokens/", headers=csrf, data={"name": "csrf-check"})
        assert own.status == 201, own.text()
        assert vic_page.request.delete(f"/api/v1/tokens/{own.json()['id']}/", headers=csrf).status == 204
        time.sleep(1)
        assert dana.api("GET", run_path).json()["status"] == "running"
        expect(vic_page.locator("header.run-header h1 .badge")).to_have_attribute("data-status", "running")

        # Dana (a member who may write) does see Stop on the same run.
        page.goto(f"/w/{team}/runs/{name}")
        expect(page.get_by_role("button", name="Stop")).to_be_visible()
        audit(page)
    finally:
        stopped = dana.api("POST", f"{run_path}stop/")
        assert stopped.status_code == 202, stopped.text
    assert _wait_finished(dana, team, name) == "stopped"


def test_the_run_page_shows_both_attempts_of_a_job_whose_runner_died(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    context = new_context(browser, stack)
    contexts.append(context)
    page = context.new_page()
    sign_in(page, stack_github, DANA)
    dana = User("dana", make_token(page, "attempts"), stack)
    submitted = dana.cli(tiny_repo(tmp_path), "run", "resumable", "-d", "-e", "NAP=467")
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)
    nav_to(page, "Runs")
    open_run(page, name)
    expect(page.locator("header.run-header .run-help")).to_have_text("Survives the loss of its runner")

    # While its first attempt runs normally, the log has no marks and the table one row.
    log = page.get_by_role("log")
    expect(log).to_contain_text("attempt=1", timeout=60_000)
    attempts = page.get_by_role("region", name="Attempts")
    expect(attempts.get_by_role("row")).to_have_count(2)
    expect(log.locator(".log-attempt")).to_have_count(0)
    first = dana.run(name)["jobs"][0]["instance"]
    deadline = time.monotonic() + 10
    while len(_sleeps(467)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)

    _kill_the_runner_of(dana, 467)
    expect(page.locator("header.run-header h1 .badge")).to_have_attribute("data-status", "succeeded", timeout=90_000)
    second = dana.run(name)["jobs"][0]["attempts"][1]["instance"]
    assert second != first

    # The page followed it live: attempt 1's lines, how it ended, attempt 2's lines.
    expect(log).to_contain_text("finished")
    text = log.locator(".log-row .log-text").all_inner_texts()
    clock = r"\d\d:\d\d:\d\d"
    assert len(text) == 6, text
    assert re.fullmatch(rf"Attempt 1 on {first} — started {clock}", text[0]), text
    assert text[1] == "attempt=1", text
    assert text[2].startswith(f"Attempt 1 ended: instance lost — machine {first} is gone"), text
    assert re.fullmatch(rf"Attempt 2 on {second} — started {clock}", text[3]), text
    assert text[4:] == ["attempt=2", "finished"], text
    rows = attempts.get_by_role("row")
    expect(rows).to_have_count(3)
    expect(rows.nth(1)).to_contain_text(first)
    expect(rows.nth(1)).to_contain_text("instance lost")
    expect(rows.nth(1)).to_contain_text(f"machine {first} is gone")
    expect(rows.nth(2)).to_contain_text(second)
    expect(rows.nth(2)).to_contain_text("done")
    audit(page)
    screenshot(page, "run-detail-attempts")


def _wait_finished(user: User, workspace: str, name: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = user.api("GET", f"/api/v1/workspaces/{workspace}/runs/{name}/").json()["status"]
        if status in {"succeeded", "failed", "stopped"}:
            return status
        time.sleep(0.3)
    raise AssertionError(f"run {name} did not finish within {timeout}s")


ELLEN = GithubUser(id=5003, login="ellen", name="Ellen Ripley")


def test_the_backends_page_connects_an_aws_account_and_lists_it(
    browser: Browser, contexts: list[BrowserContext], stack: Stack, stack_github: GithubServer, aws: MotoServer
) -> None:
    prepare(aws, regions=["us-east-1"])
    contexts.append(new_context(browser, stack))
    page = contexts[-1].new_page()
    sign_in(page, stack_github, ELLEN)

    nav_to(page, "Backends")
    expect(page.get_by_role("heading", name="Backends")).to_be_visible()
    expect(page.get_by_text(re.compile(r"^trainyard-[0-9a-f]{32}$"))).to_be_visible()  # the external id, shown first
    audit(page)
    page.get_by_label("Access keys").check()
    page.get_by_label("Bucket").fill(BUCKET)
    page.get_by_label("Access key id").fill("AKIABROWSERTEST")
    page.get_by_label("Secret access key").fill("browser-secret-value")
    page.get_by_role("button", name="Connect").click()

    expect(page.get_by_text("Connected backend aws.")).to_be_visible()
    row = page.get_by_role("row").filter(has_text="AWS account 123456789012")
    expect(row).to_contain_text("active")
    expect(row).to_contain_text("us-east-1")
    expect(row).to_contain_text(BUCKET)
    audit(page)
    screenshot(page, "backends")
    row.get_by_role("button", name="Validate").click()
    expect(page.get_by_text("Backend aws passed every check.")).to_be_visible()
    assert "browser-secret-value" not in page.content()
    row.get_by_role("button", name="Remove").click()
    page.get_by_role("button", name="Remove backend aws").click()
    expect(page.get_by_role("row").filter(has_text="AWS account 123456789012")).to_have_count(0)


def test_the_dashboard_runs_under_its_content_security_policy(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext]
) -> None:
    """Every page the server renders for a browser sends the policy, and none
    of them breaks it: sign-in through GitHub (form-action), the app's files,
    its live websocket (connect-src), avatars, the API docs and the admin."""
    context = new_context(browser, stack)
    contexts.append(context)
    context.add_init_script(
        "window.__cspViolations = [];"
        "document.addEventListener('securitypolicyviolation',"
        " (e) => window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`));"
    )
    page = context.new_page()
    console = []
    page.on("console", lambda message: console.append(message.text))
    frames: list[str] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(str(payload))))

    sign_in(page, stack_github, DANA)
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    expect(page.locator("img[src^='https://avatars.example.test/']").first).to_be_visible()
    deadline = time.monotonic() + 15
    while not any('"ready"' in frame for frame in frames) and time.monotonic() < deadline:
        page.wait_for_timeout(200)  # the runs page's live socket says it is ready
    violations = page.evaluate("window.__cspViolations")
    index = page.request.get("/")
    docs = context.new_page()
    docs.goto("/api/v1/docs/")
    expect(docs.locator(".swagger-ui .info .title")).to_contain_text("Trainyard API")
    # No audit here: the API docs are Swagger UI's page, whose own colours and
    # nested controls axe flags (docs/decisions/0045-accessibility-audit.md).
    admin = context.new_page()
    admin.goto("/admin/login/")
    expect(admin.get_by_role("button", name="Log in")).to_be_visible()
    audit(admin)

    assert "script-src 'self';" in index.headers["content-security-policy"]
    assert any('"ready"' in frame for frame in frames), frames
    assert violations == [] and docs.evaluate("window.__cspViolations") == []
    assert admin.evaluate("window.__cspViolations") == []
    assert [text for text in console if "Content Security Policy" in text] == []


def signed_in_with_a_run(
    stack: Stack,
    stack_github: GithubServer,
    browser: Browser,
    contexts: list[BrowserContext],
    tmp_path: Path,
    person: GithubUser,
    workflow: str,
) -> tuple[Page, User, str]:
    """A page signed in as ``person``, who ran ``workflow`` of tiny-train to success: (page, user, run name)."""
    context = new_context(browser, stack)
    contexts.append(context)
    page = context.new_page()
    sign_in(page, stack_github, person)
    user = User(person.login, make_token(page, workflow), stack)
    submitted = user.cli(tiny_repo(tmp_path), "run", workflow, "-d")
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)
    assert user.wait(name, lambda run: run["status"] in FINISHED, timeout=120)["status"] == "succeeded"
    return page, user, name


FRANK = GithubUser(id=5004, login="frank", name="Frank Poole")
WINDOWS = [{"width": 1280, "height": 800}, {"width": 1920, "height": 1080}]


def test_the_run_page_of_a_long_log_fills_the_window_to_the_bottom(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    """A page taller than the window (a 5,000-line log) keeps the sidebar's
    background and border down to its last row of pixels, at both sizes."""
    page, frank, name = signed_in_with_a_run(stack, stack_github, browser, contexts, tmp_path, FRANK, "chatty")

    for window in WINDOWS:
        page.set_viewport_size(window)
        page.goto(f"/w/{frank.workspace}/runs/{name}")
        expect(page.get_by_role("log")).to_contain_text("line 5000 of 5000")
        png = screenshot(page, f"run-long-log-{window['width']}x{window['height']}").read_bytes()
        assert_background_reaches_the_bottom(page, png)
        audit(page)


IRIS = GithubUser(id=5007, login="iris", name="Iris West")
LONG_LOG_LINES = 200_000
# frontend/src/lib/logwindow.ts WINDOW_LINES: the most lines the run page holds per job.
WINDOW_LINES = 20_000


def test_the_run_page_of_a_long_finished_log_opens_at_its_tail_and_holds_a_window(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    """A finished job of 200,000 lines (issue 12): the page shows its last
    line, holds at most a window of lines, shows line 1 when scrolled to the
    top, and a search jumps to a line far from what it holds."""
    page, iris, name = signed_in_with_a_run(stack, stack_github, browser, contexts, tmp_path, IRIS, "chatty")
    job = iris.run(name)["jobs"][0]["id"]
    fill_job_log(stack.database_url, job, LONG_LOG_LINES)

    page.goto(f"/w/{iris.workspace}/runs/{name}")
    log = page.get_by_role("log")
    expect(log.locator(f'[data-seq="{LONG_LOG_LINES}"]')).to_contain_text(NOISY_TEXT.format(LONG_LOG_LINES - 1))
    expect(log).to_have_attribute("data-total", str(LONG_LOG_LINES))
    audit(page)

    log.evaluate("el => { el.scrollTop = 0; }")
    expect(log.locator('[data-seq="1"]')).to_contain_text(NOISY_TEXT.format(0))
    assert 0 < int(log.get_attribute("data-held") or "0") <= WINDOW_LINES

    page.get_by_role("searchbox", name="Search logs").fill("LINE 000123456")
    expect(page.locator(".log-count")).to_have_text("line 123,457")
    expect(log.locator('[data-seq="123457"] mark.current')).to_have_text("line 000123456")
    assert 0 < int(log.get_attribute("data-held") or "0") <= WINDOW_LINES
    held = page.evaluate("() => document.querySelectorAll('.log-row[data-seq]').length")
    assert held < 200, f"{held} rows in the DOM"


GINA = GithubUser(id=5005, login="gina", name="Gina Torres")
# The sidebar's links and the heading each page shows.
PAGES = [
    ("Runs", "Runs"),
    ("Tags", "Tags"),
    ("Repos", "Repos"),
    ("Runners & instances", "Runners & instances"),
    ("Self-hosted runners", "Self-hosted runners"),
    ("Backends", "Backends"),
    ("Offers", "Offers"),
    ("Secrets", "Secrets"),
    ("Members", "Members"),
    ("API tokens", "API tokens"),
]


def test_every_page_of_the_dashboard_passes_the_accessibility_audit(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    """axe-core's WCAG 2 A and AA rules find nothing on any page, each with
    content in it: a succeeded and tagged run, its log and artifact, a token."""
    page, gina, name = signed_in_with_a_run(stack, stack_github, browser, contexts, tmp_path, GINA, "ticks")
    tagged = gina.api("POST", f"/api/v1/workspaces/{gina.workspace}/tags/", json={"name": "gina-best", "run": name})
    assert tagged.status_code == 201, tagged.text

    for item, heading in PAGES:
        nav_to(page, item)
        expect(page.get_by_role("heading", name=heading, level=1)).to_be_visible()
        expect(page.locator(".loading")).to_have_count(0)
        audit(page)
    nav_to(page, "Runs")
    open_run(page, name)
    expect(page.get_by_role("log")).to_contain_text("base model written to base_model/weights.json")
    audit(page)
    page.get_by_role("tab", name="Artifacts").click()
    page.get_by_role("button", name="weights.json").click()
    expect(page.get_by_role("region", name="Preview").locator("pre")).to_contain_text('"w": 0.0')
    audit(page)
    page.get_by_role("combobox", name="Workspace").select_option(label="+ New team workspace…")
    expect(page.get_by_role("heading", name="New team workspace")).to_be_visible()
    audit(page)


HANA = GithubUser(id=5006, login="hana", name="Hana Ito")


def test_the_runs_page_pages_by_cursor_through_more_runs_than_one_page(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext]
) -> None:
    """30 runs (put straight into the database: the list reads them as any
    run): the first page shows the newest 25, Next the 5 oldest, Previous
    the newest again."""
    context = new_context(browser, stack)
    contexts.append(context)
    page = context.new_page()
    sign_in(page, stack_github, HANA)
    _seed_finished_runs(stack, "hana", 30)

    page.reload()
    pages = page.get_by_role("navigation", name="Pages of runs")
    expect(pages).to_contain_text("1–25 of 30")
    expect(page.get_by_role("link", name="seeded-30", exact=True)).to_be_visible()
    expect(pages.get_by_role("button", name="Previous")).to_be_disabled()
    audit(page)

    pages.get_by_role("button", name="Next").click()
    expect(pages).to_contain_text("26–30 of 30")
    expect(pages).to_contain_text("Page 2")
    expect(page.get_by_role("link", name="seeded-1", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name="seeded-30", exact=True)).to_have_count(0)
    expect(pages.get_by_role("button", name="Next")).to_be_disabled()
    assert "cursor=" in page.url

    pages.get_by_role("button", name="Previous").click()
    expect(pages).to_contain_text("1–25 of 30")
    expect(page.get_by_role("link", name="seeded-30", exact=True)).to_be_visible()


def _seed_finished_runs(stack: Stack, login: str, count: int) -> None:
    """``count`` succeeded runs seeded-1 … seeded-N (newest last) in ``login``'s personal workspace."""
    import psycopg

    with psycopg.connect(stack.database_url) as conn:
        conn.execute(
            """
            INSERT INTO runs_run (id, created_at, updated_at, workspace_id, name, workflow, status, status_reason,
                submitted_by_id, code_kind, repo_url, commit, help, workflows_file_path, workflows_file_text,
                workflows_files, env_overrides, inherited_env, run_args, variables, placement_overrides,
                resource_overrides, no_cache, started_at, finished_at)
            SELECT gen_random_uuid(), now() - (%(n)s - i) * interval '1 minute', now(), w.id, 'seeded-' || i,
                'hello', 'succeeded', '', u.id, 'git', 'https://example.com/a/b.git', repeat('a', 40), '',
                '.trainyard/workflows.yaml', '', '[]', '{}', '{}', '[]', '{}', '{}', '{}', false, now(), now()
            FROM generate_series(1, %(n)s) AS i, accounts_user u
            JOIN accounts_workspace w ON w.personal_owner_id = u.id
            WHERE u.username = %(login)s
            """,
            {"n": count, "login": login},
        )


JUNE = GithubUser(id=5008, login="june", name="June Park")


def test_a_rerun_from_the_run_page_is_marked_reproduced(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    """The Re-run button opens the new run; once it ends, its header links the
    original and says its artifacts are byte-identical (docs/ENVIRONMENTS.md,
    "Reproduced"). --no-cache, which the re-run keeps, makes its job run again."""
    context = new_context(browser, stack)
    contexts.append(context)
    page = context.new_page()
    sign_in(page, stack_github, JUNE)
    june = User("june", make_token(page, "laptop"), stack)
    submitted = june.cli(tiny_repo(tmp_path), "run", "ticks", "--no-cache", "-d")
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)
    assert june.wait(name, lambda run: run["status"] in FINISHED, timeout=120)["status"] == "succeeded"

    page.goto(f"/w/{june.workspace}/runs/{name}")
    expect(page.get_by_role("heading", level=1)).to_contain_text(name)
    expect(page.locator(".rerun")).to_have_count(0)  # the original is no re-run
    page.get_by_role("button", name="Re-run", exact=True).click()
    expect(page.get_by_role("heading", level=1)).not_to_contain_text(name)
    again = page.get_by_role("heading", level=1).inner_text().split()[0]
    rerun = page.locator(".rerun")
    expect(rerun).to_contain_text(f"Re-run of {name}")
    badge = rerun.locator(".badge")
    expect(badge).to_have_attribute("data-state", "reproduced", timeout=120_000)
    expect(rerun).to_contain_text("every artifact byte-identical")
    assert june.run(again)["reproduced"]["state"] == "reproduced"
    audit(page)
    screenshot(page, "run-rerun-reproduced")
    rerun.get_by_role("link", name=name).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(name)

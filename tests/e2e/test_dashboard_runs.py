"""Starting, reading and tracing runs in the dashboard (headless Chromium
against the real stack, signed in through the local GitHub stand-in).

Lara reads a log: the Timestamps toggle shows each line's time as the raw
log's ``timestamps=1`` has it, Wrap folds a 500-character line to the
viewer's width (no sideways scroll) and both stay on after a reload; a
line's number is its permalink, and opening ``…#L<seq>`` of a 5,000-line
log shows that line highlighted, not the tail. Milo starts a run from the
New run form: the repository and workflow come from his last CLI
submission, ``-e`` values and resources reach the job, and a workflow the
server refuses (a tag that does not exist) shows the server's message on
the form. Nils tags a run and feeds it to another: the Lineage tab of each
shows the other, with the tag between them. The Environments page lists the
workspace's environments. Every page passes the accessibility audit.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect

from tests.e2e.conftest import FINISHED, User, commit_all, make_repo, run_name_of
from tests.e2e.test_dashboard import nav_to, screenshot
from tests.e2e.test_dashboard_metrics import no_csp_violations, signed_in
from tests.support.accessibility import audit
from tests.support.github import GithubServer, GithubUser
from tests.support.stack import Stack

# People of this file's own on the shared stack (tests/core/test_parallel_workers.py).
LARA = GithubUser(id=5601, login="lara", name="Lara Croft")
MILO = GithubUser(id=5602, login="milo", name="Milo Thatch")
NILS = GithubUser(id=5603, login="nils", name="Nils Holgersson")

WORKFLOWS = """\
workflows:
  - name: chatty
    provider: bash
    commands:
      - "seq -f 'row %.0f of 5000' 1 5000"
      - "printf 'wide-%0500d-end\\\\n' 7"

  - name: greet
    provider: bash
    commands:
      # -e values are masked in logs as secrets are: print it changed
      - echo "greeting=${GREETING:-none}" | tr a-z A-Z

  - name: evaluate
    provider: bash
    deps:
      - tag: milo-missing
    commands:
      - echo never

  - name: base
    provider: bash
    commands:
      - mkdir -p model && echo weights-v1 > model/w.txt
    artifacts:
      - ./model

  - name: finetune
    provider: bash
    deps:
      - tag: nils-base
    commands:
      - cat model/w.txt
"""
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def runs_repo(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "runs-repo")
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    commit_all(repo, "workflows")
    return repo


def finished(user: User, repo: Path, workflow: str, *args: str) -> str:
    """Run ``workflow`` with the CLI; its name once it succeeded."""
    submitted = user.cli(repo, "run", workflow, "-d", *args)
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)
    assert user.wait(name, lambda run: run["status"] in FINISHED, timeout=120)["status"] == "succeeded"
    return name


def row_of(page: Page, seq: int) -> Locator:
    return page.get_by_role("log").locator(f'.log-row[data-seq="{seq}"]')


def test_the_log_viewer_shows_timestamps_wraps_and_links_to_a_line(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    page, lara = signed_in(browser, contexts, stack, stack_github, LARA, "logs")
    name = finished(lara, runs_repo(tmp_path), "chatty")
    job = lara.run(name)["jobs"][0]
    page.goto(f"/w/{lara.workspace}/runs/{name}")
    log = page.get_by_role("log")
    expect(log).to_contain_text("wide-0000")
    tools = page.get_by_role("toolbar", name="Log tools for Logs of chatty")

    # Timestamps: each line's time, as the raw log with timestamps=1 has it (there to the microsecond).
    expect(log.locator(".log-ts")).to_have_count(0)
    tools.get_by_role("button", name="Timestamps").click()
    expect(tools.get_by_role("button", name="Timestamps")).to_have_attribute("aria-pressed", "true")
    shown = row_of(page, 5000).locator(".log-ts").inner_text()
    assert STAMP.match(shown), shown
    raw = lara.api("GET", f"/api/v1/workspaces/{lara.workspace}/jobs/{job['id']}/logs/raw", params={"timestamps": 1})
    stamped = next(line for line in raw.text.splitlines() if line.endswith(" row 5000 of 5000"))
    gap = _when(shown) - _when(stamped.split(" ", 1)[0])
    assert abs(gap.total_seconds()) < 0.002, (shown, stamped)
    audit(page)

    # Wrap: the 500-character line takes several rows' height and the log no longer scrolls sideways.
    wide = row_of(page, 5001)
    one_row = row_of(page, 5000).bounding_box()
    assert one_row is not None
    assert log.evaluate("el => el.scrollWidth > el.clientWidth + 1"), "the wide line should scroll sideways unwrapped"
    tools.get_by_role("button", name="Wrap").click()
    expect(log).to_have_attribute("data-wrap", "on")
    page.wait_for_function(
        "() => { const r = document.querySelector('.log-row[data-seq=\"5001\"]'); return r && r.offsetHeight > 40; }"
    )
    box = wide.bounding_box()
    assert box is not None and box["height"] >= 3 * one_row["height"], (box, one_row)
    assert log.evaluate("el => el.scrollWidth <= el.clientWidth + 1")
    text = wide.locator(".log-text")
    assert text.evaluate("el => el.scrollHeight <= el.parentElement.offsetHeight + 1"), "the wrapped text is cut off"
    expect(text).to_contain_text("-end")
    screenshot(page, "log-viewer-wrapped-with-timestamps")
    audit(page)

    # Both toggles stay on after a reload.
    page.reload()
    expect(page.get_by_role("log")).to_have_attribute("data-wrap", "on")
    expect(page.get_by_role("log")).to_have_attribute("data-timestamps", "on")
    tools.get_by_role("button", name="Wrap").click()
    tools.get_by_role("button", name="Timestamps").click()
    expect(page.get_by_role("log")).to_have_attribute("data-wrap", "off")

    # A line's number is its permalink; opened, the log shows that line highlighted instead of the tail.
    row_of(page, 4990).get_by_role("link", name="Line 4990").click()
    assert page.url.endswith("#L4990"), page.url
    assert "job=chatty" in page.url, page.url
    expect(row_of(page, 4990)).to_have_class(re.compile(r"\blog-linked\b"))
    link = page.url.replace("#L4990", "#L120")
    fresh = contexts[0].new_page()
    fresh.goto(link)
    expect(row_of(fresh, 120)).to_have_class(re.compile(r"\blog-linked\b"))
    expect(row_of(fresh, 120)).to_be_in_viewport()
    row_box, log_box = row_of(fresh, 120).bounding_box(), fresh.get_by_role("log").bounding_box()
    assert row_box and log_box and log_box["y"] <= row_box["y"] <= log_box["y"] + log_box["height"] - row_box["height"]
    expect(row_of(fresh, 120)).to_contain_text("row 120 of 5000")
    expect(fresh.get_by_role("log")).to_have_attribute("data-follow", "off")
    expect(row_of(fresh, 5000)).to_have_count(0)
    audit(fresh)
    screenshot(fresh, "log-viewer-permalink")
    no_csp_violations(fresh)


def test_the_new_run_form_starts_a_run_like_the_cli(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    page, milo = signed_in(browser, contexts, stack, stack_github, MILO, "new-run")
    first = finished(milo, runs_repo(tmp_path), "greet")

    nav_to(page, "Runs")
    page.get_by_role("link", name="New run").click()
    expect(page.get_by_role("heading", name="New run", level=1)).to_be_visible()
    form = page.get_by_role("form", name="New run")
    expect(form.get_by_label("Repository")).to_contain_text("runs-repo")
    expect(form.get_by_role("link", name=first)).to_be_visible()
    audit(page)

    # A line that is no NAME=value is refused on the page, naming the line; nothing is sent.
    form.get_by_label("Workflow").select_option("greet")
    form.get_by_label("Environment variables").fill("GREETING=hello-from-the-form\nnot a pair")
    form.get_by_role("button", name="Start run").click()
    expect(form.get_by_role("alert")).to_contain_text('line 2: "not a pair" is not NAME=value')

    # The server's refusal shows on the form: evaluate's deps name a tag that does not exist.
    form.get_by_label("Environment variables").fill("GREETING=hello-from-the-form")
    form.get_by_label("Workflow").select_option("evaluate")
    form.get_by_role("button", name="Start run").click()
    expect(form.get_by_role("alert")).to_contain_text("milo-missing")
    audit(page)
    runs = milo.api("GET", f"/api/v1/workspaces/{milo.workspace}/runs/").json()["results"]
    assert [r["name"] for r in runs] == [first]

    # Resources the server refuses (as `trainyard run --memory` would be) show on the form too.
    form.get_by_label("Workflow").select_option("greet")
    form.get_by_label("Memory").fill("lots")
    form.get_by_role("button", name="Start run").click()
    expect(form.get_by_role("alert")).to_contain_text("memory")
    audit(page)

    # greet with -e and a CPU count for every job: the run page opens and the job has both.
    form.get_by_label("Memory").fill("")
    form.get_by_label("CPUs").fill("1")
    form.get_by_role("button", name="Start run").click()
    expect(page.get_by_role("heading", level=1)).not_to_contain_text("New run")
    started = page.get_by_role("heading", level=1).inner_text().split()[0]
    assert started != first
    expect(page.get_by_role("log")).to_contain_text("GREETING=HELLO-FROM-THE-FORM", timeout=120_000)
    run = milo.wait(started, lambda r: r["status"] in FINISHED, timeout=120)
    assert run["status"] == "succeeded", run
    assert run["workflow"] == "greet"
    assert run["code"] == milo.run(first)["code"]
    assert run["jobs"][0]["resources"]["cpu"] == 1, run["jobs"][0]["resources"]
    audit(page)
    screenshot(page, "new-run-started")


def test_the_lineage_tab_shows_a_tags_producer_and_its_consumer(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    page, nils = signed_in(browser, contexts, stack, stack_github, NILS, "lineage")
    repo = runs_repo(tmp_path)
    base = finished(nils, repo, "base")
    tagged = nils.api("POST", f"/api/v1/workspaces/{nils.workspace}/tags/", json={"name": "nils-base", "run": base})
    assert tagged.status_code == 201, tagged.text
    tuned = finished(nils, repo, "finetune")
    assert "weights-v1" in nils.cli(repo, "logs", tuned).stdout

    # The producer: its Lineage tab says who used it, and through which tag.
    page.goto(f"/w/{nils.workspace}/runs/{base}")
    page.get_by_role("tab", name="Lineage").click()
    used_by = page.get_by_role("region", name="Used by")
    consumer = used_by.locator(f'[data-run="{tuned}"]')
    expect(consumer).to_contain_text("finetune")
    expect(consumer).to_contain_text("read")
    expect(consumer.locator('[data-kind="tag"]')).to_contain_text("tag nils-base")
    expect(page.get_by_role("region", name="Fed by")).to_contain_text("read no other run")
    audit(page)
    screenshot(page, "run-lineage-producer")

    # The consumer: fed by the tagged run, the tag named; its link opens the producer.
    consumer.get_by_role("link", name=tuned).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(tuned)
    page.get_by_role("tab", name="Lineage").click()
    fed_by = page.get_by_role("region", name="Fed by")
    producer = fed_by.locator(f'[data-run="{base}"]')
    expect(producer.locator(".tag")).to_have_text("nils-base")
    expect(producer.locator('[data-kind="tag"]')).to_contain_text("job finetune read it as tag nils-base")
    expect(page.get_by_role("region", name="Used by")).to_contain_text("No run has used its artifacts yet.")
    audit(page)
    producer.get_by_role("link", name=base, exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(base)

    # The API bounds its depth and answers a precise error past it.
    path = f"/api/v1/workspaces/{nils.workspace}/runs/{tuned}/lineage/"
    graph = nils.api("GET", path, params={"depth": 1}).json()
    assert [(r["name"], r["distance"]) for r in graph["runs"]] == [(base, -1), (tuned, 0)]
    assert graph["edges"] == [
        {"producer": base, "consumer": tuned, "kind": "tag", "name": "nils-base", "job": "finetune"}
    ]
    refused = nils.api("GET", path, params={"depth": 9})
    assert refused.status_code == 400, refused.text
    assert refused.json()["message"] == "depth must be between 1 and 5."


def test_the_environments_page_lists_the_workspaces_environments(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext]
) -> None:
    """An environment as a runner records one (put straight into the database): listed, then opened."""
    page, _ = signed_in(browser, contexts, stack, stack_github, NILS, "environments")
    _seed_environment(stack, "nils", key="0123456789abcdef01234567")
    nav_to(page, "Environments")
    expect(page.get_by_role("heading", name="Environments", level=1)).to_be_visible()
    row = page.locator('tr[data-environment="0123456789abcdef01234567"]')
    expect(row).to_contain_text("Python 3.12")
    expect(row).to_contain_text("2.0 MB")
    audit(page)
    row.get_by_role("button", name="0123456789ab").click()
    detail = page.get_by_role("region", name="Environment 0123456789ab")
    expect(detail.get_by_label("Installed packages")).to_have_text("numpy==2.1.0\n")
    lock = detail.get_by_role("link", name="Download the lock")
    with page.expect_download() as download:
        lock.click()
    assert Path(download.value.path()).read_text() == "numpy==2.1.0 --hash=sha256:00\n"
    audit(page)
    screenshot(page, "environments")


def _seed_environment(stack: Stack, login: str, *, key: str) -> None:
    import psycopg

    with psycopg.connect(stack.database_url) as conn:
        conn.execute(
            """
            INSERT INTO runs_environment (id, workspace_id, key, recipe, lock, packages, platform, build_seconds,
                size_bytes, built_on, created_at, updated_at, last_used_at)
            SELECT gen_random_uuid(), w.id, %(key)s, repeat('b', 64), 'numpy==2.1.0 --hash=sha256:00' || chr(10),
                'numpy==2.1.0' || chr(10), '{"python": "3.12", "os": "linux", "machine": "x86_64"}'::jsonb, 12.5,
                2097152, 'local-1', now(), now(), now()
            FROM accounts_user u JOIN accounts_workspace w ON w.personal_owner_id = u.id
            WHERE u.username = %(login)s
            ON CONFLICT DO NOTHING
            """,
            {"key": key, "login": login},
        )


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

"""The Costs page (docs/COST.md, "Where costs are shown") in headless
Chromium against the real stack, signed in through the local GitHub stand-in.

Bram makes a team workspace and adds Mika; each submits runs with the CLI and
they run on the local runners. Each finished attempt is then moved onto a
terminated machine with a price of its own (a copy of the runner's instance
row, priced, up from a minute before the attempt to two after it); each
attempt is made 20 minutes long (its start moved back) and the earlier
runs' attempts a day or three earlier (not before the month began), so the
month's spending is fixed, spread over days, and mostly the jobs' rather
than EC2's 60 s minimum. The page
opened from the sidebar shows the month's total, the idle line and each
person's cost exactly as the API's report does (the amounts behind the text,
and the text rounded to cents), and its tables add up to the total. The page
passes the accessibility audit, breaks no rule of the Content-Security-Policy,
and is screenshotted to ``test-artifacts/screenshots/costs-page.png``.
"""

from __future__ import annotations

import secrets
import time
import uuid
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, BrowserContext, expect

from tests.e2e.conftest import FINISHED, User, commit_all, make_repo, run_name_of
from tests.e2e.test_dashboard import nav_to, screenshot
from tests.e2e.test_dashboard_metrics import no_csp_violations, signed_in
from tests.support.accessibility import audit
from tests.support.github import GithubServer, GithubUser
from tests.support.stack import Stack

# People of this file's own on the shared stack (tests/core/test_parallel_workers.py).
BRAM = GithubUser(id=5401, login="bram", name="Bram Okafor")
MIKA = GithubUser(id=5402, login="mika", name="Mika Sato")

WORKFLOWS = """\
workflows:
  - name: prep
    provider: bash
    commands:
      - "echo preparing; sleep 2"

  - name: train
    provider: bash
    commands:
      - "echo training; sleep 3"
"""

# USD an hour of each person's machines (a g5.xlarge's, a g4dn.xlarge's).
PRICES = {"bram": Decimal("3.060000"), "mika": Decimal("1.212000")}


def finished_run(user: User, team: str, name: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run = user.api("GET", f"/api/v1/workspaces/{team}/runs/{name}/").json()
        if run["status"] in FINISHED:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {name} did not finish in {timeout}s: {run}")
        time.sleep(0.3)


def price_the_attempts(stack: Stack, run: dict[str, Any], price: Decimal, *, days_back: int) -> None:
    """Each attempt of ``run`` lasts 20 minutes up to its end, ``days_back``
    days earlier (unless that is in last month), and moves onto a copy of
    its machine's row that is priced and terminated: up a minute before the
    attempt started, terminated two minutes after it ended (the copy's idle line)."""
    import psycopg

    with psycopg.connect(stack.database_url) as conn:
        columns = [
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'clouds_instance'"
            ).fetchall()
        ]
        for job in run["jobs"]:
            for attempt in job["attempts"]:
                attempt_id, instance_id, started, finished = conn.execute(
                    "SELECT id, instance_id, started_at, finished_at FROM runs_attempt WHERE job_id = %s AND number = %s",
                    (uuid.UUID(job["id"]), attempt["number"]),
                ).fetchone()
                assert instance_id is not None and started is not None and finished is not None, attempt
                month_start = finished.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
                back = timedelta(days=days_back)
                if finished - back - timedelta(minutes=21) < month_start:
                    back = timedelta(0)
                finished -= back
                started = max(month_start + timedelta(seconds=30), finished - timedelta(minutes=20))
                fixed = {
                    "id": uuid.uuid4(),
                    "name": f"priced-{secrets.token_hex(4)}",
                    "token_hash": secrets.token_hex(32),
                    "status": "terminated",
                    "price_per_hour": price,
                    "price_source": "test price",
                    "running_at": started - timedelta(minutes=1),
                    "terminated_at": finished + timedelta(minutes=2),
                }
                copied = [c for c in columns if c not in fixed]
                names = ", ".join([*fixed, *copied])
                values = ", ".join(["%s"] * len(fixed) + copied)
                conn.execute(
                    f"INSERT INTO clouds_instance ({names}) SELECT {values} FROM clouds_instance WHERE id = %s",
                    (*fixed.values(), instance_id),
                )
                conn.execute(
                    "UPDATE runs_attempt SET instance_id = %s, started_at = %s, finished_at = %s WHERE id = %s",
                    (fixed["id"], started, finished, attempt_id),
                )


def cents(amount: str) -> str:
    """The API's decimal string as the page shows it: to the cent, half up ("<$0.01" below a cent)."""
    value = Decimal(amount)
    if Decimal(0) < value < Decimal("0.01"):
        return "<$0.01"
    return f"${value.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):,}"


def test_the_costs_page_shows_the_months_total_and_each_persons_cost_as_the_api_reports_them(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    mika_page, mika = signed_in(browser, contexts, stack, stack_github, MIKA, "costs")
    page, bram = signed_in(browser, contexts, stack, stack_github, BRAM, "costs")
    made = bram.api("POST", "/api/v1/workspaces/", json={"name": "Cost team"})
    assert made.status_code == 201, made.text
    team = made.json()["slug"]
    added = bram.api("POST", f"/api/v1/workspaces/{team}/members/", json={"github_login": "mika", "role": "member"})
    assert added.status_code == 201, added.text

    repo = make_repo(tmp_path / "costs")
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    commit_all(repo, "workflows")
    submitted = [(bram, "prep"), (bram, "train"), (mika, "train")]
    names = []
    for user, workflow in submitted:
        result = user.cli(repo, "run", workflow, "-d", env={"TRAINYARD_WORKSPACE": team})
        assert result.returncode == 0, result.stderr + result.stdout
        names.append((user, run_name_of(result)))
    for (user, name), days_back in zip(names, [3, 1, 0], strict=True):
        run = finished_run(user, team, name)
        assert run["status"] == "succeeded", run
        price_the_attempts(stack, run, PRICES[user.name], days_back=days_back)

    answer = bram.api("GET", f"/api/v1/workspaces/{team}/costs/", params={"by": "user"})
    assert answer.status_code == 200, answer.text
    report = answer.json()
    by_user = {row["key"]: row["cost"] for row in report["rows"]}
    # Both people spent something, and the machines idled (the copies' 120 s around each attempt).
    assert set(by_user) == {"bram", "mika"}, report
    assert all(Decimal(cost) > 0 for cost in by_user.values()), report
    assert Decimal(report["idle"]) > 0, report
    assert Decimal(report["total"]) == sum(map(Decimal, by_user.values())) + Decimal(report["idle"])

    page.goto(f"/w/{team}/runs")
    nav_to(page, "Costs")
    expect(page.get_by_role("heading", name="Costs", level=1)).to_be_visible()
    total = page.get_by_test_id("cost-total")
    expect(total).to_have_attribute("data-amount", report["total"])
    expect(total).to_have_text(cents(report["total"]))
    expect(page.get_by_test_id("cost-idle")).to_have_text(cents(report["idle"]))

    users = page.get_by_role("table", name="By user")
    expect(users.locator("tbody tr")).to_have_count(len(by_user))
    for name, cost in by_user.items():
        amount = users.locator(f'tbody tr[data-key="{name}"] td[data-amount]')
        expect(amount).to_have_attribute("data-amount", cost)
        expect(amount).to_have_text(cents(cost))
    expect(users.locator("tfoot tr.total-row td[data-amount]")).to_have_text(cents(report["total"]))
    # The workflow table adds up to the same total: prep (bram's) and train (both).
    workflows = page.get_by_role("table", name="By workflow")
    expect(workflows.locator("tbody tr")).to_have_count(2)
    expect(workflows.locator("tfoot tr.total-row td[data-amount]")).to_have_attribute("data-amount", report["total"])
    # Each day's bar holds that day's attempts, as the API reports them by day.
    days = bram.api("GET", f"/api/v1/workspaces/{team}/costs/", params={"by": "day"}).json()["rows"]
    assert sum(Decimal(row["cost"]) for row in days) == Decimal(report["total"]) - Decimal(report["idle"]), days
    for row in days:
        expect(page.locator(f'.cost-chart-bar[data-key="{row["key"]}"]')).to_have_attribute("data-cost", row["cost"])
    expect(page.locator(".cost-chart-bar")).to_have_count(int(page.evaluate("new Date().getUTCDate()")))
    audit(page)
    no_csp_violations(page)
    screenshot(page, "costs-page")

    # Mika, a member, reads the same numbers.
    mika_page.goto(f"/w/{team}/costs")
    expect(mika_page.get_by_test_id("cost-total")).to_have_attribute("data-amount", report["total"])
    mine = mika_page.get_by_role("table", name="By user").locator('tbody tr[data-key="mika"] td[data-amount]')
    expect(mine).to_have_text(cents(by_user["mika"]))

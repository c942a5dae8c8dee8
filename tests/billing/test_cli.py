"""`trainyard ps`, `show` and `cost` against the real web server (uvicorn
on the test database): the COST column, a run's, its job's and its
attempts' costs, and the workspace's report with its idle line and total."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from trainyard.cli import cli

from backend.accounts.models import Workspace
from backend.runs.models import Run
from tests.billing.test_selectors import T, attempt, machine
from tests.support.fixtures import Person
from tests.support.web import WebServers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli_env(team: Workspace, owner: Person, web_server: WebServers, monkeypatch: pytest.MonkeyPatch) -> Any:
    server = web_server.start()
    monkeypatch.setenv("TRAINYARD_URL", server.url)
    monkeypatch.setenv("TRAINYARD_TOKEN", owner.token)
    monkeypatch.setenv("TRAINYARD_WORKSPACE", "acme")
    return server


@pytest.fixture
def interrupted_run(team: Workspace, run: Run) -> Run:
    """Attempt 1: 1000 s of a $2.5236/h machine ($0.7010); attempt 2: 1800 s of a $0.9648/h one ($0.4824)."""
    job = run.jobs.get()
    attempt(job, 1, machine(team, "2.5236", 0, 1010), 10, 1010)
    attempt(job, 2, machine(team, "0.9648", 2000, 3830), 2010, 3810)
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    return run


def _invoke(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_ps_shows_each_runs_cost_and_show_its_jobs_and_attempts(interrupted_run: Run, cli_env: Any) -> None:
    header, row = _invoke("ps").splitlines()
    assert header.split() == ["NAME", "WORKFLOW", "STATUS", "SUBMITTED", "DURATION", "COST"]
    assert row.split()[0] == interrupted_run.name and row.split()[-1] == "$1.18"

    shown = _invoke("show", interrupted_run.name).splitlines()
    assert "Cost: $1.18 (USD, every attempt of every job)" in shown
    costs = shown[shown.index("Costs:") + 1 :][:3]
    assert costs[0] == "  hello: $1.18"
    assert costs[1].startswith("    attempt 1: $0.70 = $2.5236/h x 16m 40s on m-")
    assert costs[2].startswith("    attempt 2: $0.48 = $0.9648/h x 30m on m-")


def test_show_names_the_runs_max_cost_and_an_admins_override(interrupted_run: Run, cli_env: Any) -> None:
    Run.objects.filter(pk=interrupted_run.pk).update(max_cost="20", budget_override=True)
    shown = _invoke("show", interrupted_run.name).splitlines()
    assert "Max cost: $20.00 (the run is stopped by the budget when it is reached)" in shown
    assert "Budgets: overridden by an admin (the workspace's and the submitter's budgets do not stop it)" in shown
    Run.objects.filter(pk=interrupted_run.pk).update(max_cost=None, budget_override=False)
    plain = _invoke("show", interrupted_run.name)
    assert "Max cost" not in plain and "overridden" not in plain


def test_cost_reports_the_rows_the_idle_line_and_the_total(interrupted_run: Run, cli_env: Any) -> None:
    since = T.date().isoformat()
    out = _invoke("cost", "--since", since, "--until", "2026-11-03", "--by", "workflow").splitlines()
    assert out[0] == f"Costs from {since}T00:00:00Z to 2026-11-03T00:00:00Z (USD):"
    # Idle: 10 s of machine 1 ($0.0070) and 30 s of machine 2 ($0.0080).
    assert [line.split() for line in out[1:]] == [
        ["WORKFLOW", "COST"],
        ["hello", "$1.18"],
        ["(idle)", "$0.02"],
        ["TOTAL", "$1.20"],
    ]
    empty = _invoke("cost", "--since", "2026-10-01", "--until", "2026-10-02").splitlines()
    assert [line.split() for line in empty[1:]] == [["USER", "COST"], ["(idle)", "$0.00"], ["TOTAL", "$0.00"]]


def test_budget_sets_shows_and_removes_the_workspaces_and_a_members_budget(
    team: Workspace, owner: Person, member: Person, cli_env: Any
) -> None:
    from tests.billing.test_budgets import spent_now
    from tests.support.fixtures import submit

    spent_now(submit(team, owner.user), "123.45")
    assert _invoke("budget", "set", "500", "--warn", "90") == (
        "The workspace's budget: $500.00 a month, notify at 90% ($123.45 spent this month).\n"
    )
    assert _invoke("budget", "set", "off", "--user", "mateo", "--gpus", "2") == (
        "mateo's budget: no monthly limit, at most 2 GPUs at once, notify at 80% ($0.00 spent this month).\n"
    )
    out = _invoke("budget").splitlines()
    assert out[0].startswith("Budgets for ") and out[0].endswith(" (UTC, USD):")
    assert [line.split() for line in out[1:]] == [
        ["BUDGET", "LIMIT", "SPENT", "USED", "RATE", "GPUS", "WARN", "AT"],
        ["(workspace)", "$500.00", "$123.45", "24.7%", "$0.00/h", "-", "90%"],
        ["mateo", "-", "$0.00", "-", "$0.00/h", "0/2", "80%"],
    ]
    assert _invoke("budget", "rm", "--user", "mateo") == "Removed mateo's budget.\n"
    assert _invoke("budget", "rm") == "Removed the workspace's budget.\n"
    assert [line.split()[0] for line in _invoke("budget").splitlines()[2:]] == ["(workspace)"]


def test_budget_set_with_a_bad_amount_says_why_and_saves_nothing(team: Workspace, cli_env: Any) -> None:
    from backend.billing.models import Budget

    result = CliRunner().invoke(cli, ["budget", "set", "--", "-5"])
    assert result.exit_code != 0
    assert "monthly_limit: must be more than $0, got -5." in result.output
    result = CliRunner().invoke(cli, ["budget", "set", "lots"])
    assert "monthly_limit: 'lots' is not an amount of USD (write e.g. 500 or 499.99)." in result.output
    assert not Budget.objects.exists()

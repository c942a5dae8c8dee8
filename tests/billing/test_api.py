"""Costs in the API: a run's, its jobs' and attempts' (list and run page
alike), and the workspace's report with its idle line; bad input is a 400
that says what to send."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from backend.accounts.models import Workspace
from backend.runs.models import Run
from tests.billing.test_selectors import T, attempt, machine
from tests.support.fixtures import Person, submit

BASE = "/api/v1/workspaces/acme"


@pytest.fixture
def interrupted_run(team: Workspace, run: Run) -> Run:
    """Attempt 1 held a $2.5236/h spot machine 1000 s and was interrupted;
    attempt 2 held a $0.9648/h one 1800 s and ended; the second machine ran
    on 120 s after it (idle)."""
    job = run.jobs.get()
    attempt(job, 1, machine(team, "2.5236", 0, 1010), 10, 1010)
    attempt(job, 2, machine(team, "0.9648", 2000, 3830), 2010, 3810)
    return run


def test_a_runs_cost_is_the_sum_of_its_attempts_in_the_list_and_on_its_page(
    interrupted_run: Run, member: Person
) -> None:
    client = member.client()
    listed = client.get(f"{BASE}/runs/").json()["results"][0]
    page = client.get(f"{BASE}/runs/{interrupted_run.name}/").json()
    for shown in (listed, page):
        # 2.5236 x 1000 / 3600 = 0.7010; 0.9648 x 1800 / 3600 = 0.4824.
        assert shown["cost"] == "1.1834"
        (job,) = shown["jobs"]
        assert job["cost"] == "1.1834"
        assert [(a["price_per_hour"], a["billed_seconds"], a["cost"]) for a in job["attempts"]] == [
            ("2.523600", 1000, "0.7010"),
            ("0.964800", 1800, "0.4824"),
        ]


def test_a_run_that_never_held_a_machine_has_no_cost(run: Run, member: Person) -> None:
    assert member.client().get(f"{BASE}/runs/{run.name}/").json()["cost"] is None


def test_the_workspace_report_has_a_total_the_rows_and_the_idle_line(
    team: Workspace, owner: Person, viewer: Person, interrupted_run: Run
) -> None:
    other = submit(team, owner.user, workflow="hello")
    attempt(other.jobs.get(), 1, machine(team, "3.6", 5000, 5020), 5000, 5010)  # 10 s of a 60 s minimum
    since, until = T.isoformat(), (T + timedelta(days=1)).isoformat()
    answer = viewer.client().get(f"{BASE}/costs/", {"since": since, "until": until, "by": "workflow"})
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    # Idle: machine 2 billed 1830 s, held 1800 (30 s x 0.9648/3600 = 0.0080), machine 1 billed 1010 s,
    # held 1000 (0.0070), machine 3 billed 60 s, held 10 (0.0500).
    assert (body["currency"], body["by"], body["idle"]) == ("USD", "workflow", "0.0650")
    assert body["rows"] == [{"key": "hello", "cost": "1.1934"}]
    assert Decimal(body["total"]) == Decimal("1.1934") + Decimal("0.0650")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"by": "region"}, "by: one of user, workflow, backend, day, week, month, not 'region'."),
        ({"since": "yesterday"}, "since: 'yesterday' is not a date or time (2026-11-01, 2026-11-01T09:00:00Z) nor an age (30d, 12h)."),
        ({"since": "2026-11-02", "until": "2026-11-01"}, "since (2026-11-02T00:00:00+00:00) must be before until (2026-11-01T00:00:00+00:00)."),
        ({"since": "2024-01-01", "until": "2026-01-01"}, "since..until: at most 400 days at once."),
    ],
)  # fmt: skip
def test_a_bad_report_query_is_a_400_that_says_what_to_send(
    member: Person, query: dict[str, str], message: str
) -> None:
    answer = member.client().get(f"{BASE}/costs/", query)
    assert (answer.status_code, answer.json()["message"]) == (400, message)

"""Estimates and admission through the API, priced by a fake cloud's
offers: the plan and the dry run show each job's and the run's most, a
submission the budgets have no room for is refused with the numbers and
writes nothing, ``queue`` makes it wait, an admin's override lets it past
(audited), and a run's own ``max_cost`` is checked (docs/COST.md)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from backend.accounts.models import AuditEvent, AuditKind, Workspace
from backend.billing.models import Budget
from backend.runs.models import Attempt, Job, JobStatus, Run, SubmissionKey
from tests.billing.test_budgets import spent_now
from tests.support.fixtures import Person, submit

BASE = "/api/v1/workspaces/acme"

TWO_JOBS = """\
workflows:
  - name: prep
    provider: bash
    commands: [python prep.py]
    artifacts: [./data]
    max_duration: 4h
  - name: train
    provider: bash
    commands: [python train.py]
    deps:
      - workflow: prep
    max_duration: 4h
  - name: forever
    provider: bash
    commands: [python serve.py]
  - name: capped
    provider: bash
    commands: [python train.py]
    max_duration: 1h
    max_cost: 3.5
"""


def body(workflow: str = "train", text: str = TWO_JOBS, **extra: Any) -> dict[str, Any]:
    return {
        "workflow": workflow,
        "workflows_file": {"path": ".trainyard/workflows.yaml", "text": text},
        "code": {"kind": "git", "repo_url": "https://example.com/acme/models.git", "commit": "c" * 40},
        **extra,
    }


@pytest.fixture
def priced(fake_offers: Callable[..., Any]) -> None:
    """The cheapest offer costs $3/h ($0.05 a billing minute)."""
    fake_offers(("small", 3.0), ("big", 7.5))


def _nothing_written() -> None:
    assert (Run.objects.count(), Job.objects.count(), Attempt.objects.count(), SubmissionKey.objects.count()) == (
        0,
        0,
        0,
        0,
    )
    assert not AuditEvent.objects.filter(kind=AuditKind.BUDGET).exclude(action="budget.set").exists()


# ------------------------------------------------------------------ estimates


def test_the_plan_and_the_dry_run_show_each_jobs_and_the_runs_most(
    priced: None, team: Workspace, member: Person
) -> None:
    client = member.client()
    created = client.post(f"{BASE}/runs/", body(), format="json")
    assert created.status_code == 201, created.content
    answer = created.json()
    # 2 jobs, each $3/h for 4 h.
    assert [(j["job"], j["offer"]["price_per_hour"], j["max_cost"]) for j in answer["plan"]] == [
        ("prep", 3.0, "12.0000"),
        ("train", 3.0, "12.0000"),
    ]
    assert answer["estimate"] == "24.0000"
    stored = Job.objects.filter(run__name=answer["name"]).values_list("estimate_max_cost", flat=True)
    assert list(stored) == [Decimal("12.0000")] * 2

    dry = client.post(f"{BASE}/runs/plan/", body(), format="json").json()
    assert [(j["name"], j["offer"]["price_per_hour"], j["max_cost"]) for j in dry["jobs"]] == [
        ("prep", 3.0, "12.0000"),
        ("train", 3.0, "12.0000"),
    ]
    assert dry["estimate"] == "24.0000"


def test_a_job_without_max_duration_is_unbounded_and_so_is_its_run(
    priced: None, team: Workspace, member: Person
) -> None:
    created = member.client().post(f"{BASE}/runs/", body("forever"), format="json").json()
    assert (created["plan"][0]["max_cost"], created["estimate"]) == (None, None)
    assert Job.objects.get().estimate_max_cost is None
    dry = member.client().post(f"{BASE}/runs/plan/", body("forever"), format="json").json()
    assert (dry["jobs"][0]["max_cost"], dry["estimate"]) == (None, None)


# ------------------------------------------------------------------ admission


def test_a_run_over_the_workspace_budget_is_refused_with_the_numbers_and_writes_nothing(
    priced: None, team: Workspace, owner: Person, member: Person
) -> None:
    Budget.objects.create(workspace=team, monthly_limit=Decimal("500"))
    spent_now(submit(team, owner.user), "487.20")
    before = (Run.objects.count(), Job.objects.count(), Attempt.objects.count())

    answer = member.client().post(f"{BASE}/runs/", body(), format="json", HTTP_IDEMPOTENCY_KEY="refused-once")

    assert answer.status_code == 409, answer.content
    assert answer.json()["message"] == (
        "workspace budget: $500.00 this month, $487.20 spent, this run may cost up to $24.00 "
        "(2 jobs × max_duration 4h); raise it (trainyard budget set 512), lower max_duration, "
        "or submit with --queue"
    )
    assert answer.json()["extra"]["budget"] == {
        "user": None,
        "monthly_limit": "500.00",
        "spent": "487.2000",
        "estimate": "24.0000",
        "minute": "0.1000",
    }
    assert (Run.objects.count(), Job.objects.count(), Attempt.objects.count()) == before
    assert not SubmissionKey.objects.exists()
    assert not Run.objects.filter(submitted_by=member.user).exists()


def test_a_refused_submission_writes_no_run_no_job_no_key_and_no_audit(
    priced: None, team: Workspace, member: Person
) -> None:
    Budget.objects.create(workspace=team, user=member.user, monthly_limit=Decimal("20"))

    answer = member.client().post(f"{BASE}/runs/", body(), format="json", HTTP_IDEMPOTENCY_KEY="k-1")

    assert answer.status_code == 409, answer.content
    assert answer.json()["message"] == (
        "mateo's budget: $20.00 this month, $0.00 spent, this run may cost up to $24.00 "
        "(2 jobs × max_duration 4h); raise it (trainyard budget set 24 --user mateo), lower max_duration, "
        "or submit with --queue"
    )
    _nothing_written()


def test_an_unbounded_run_is_refused_when_one_billing_minute_would_reach_the_limit(
    priced: None, team: Workspace, owner: Person, member: Person
) -> None:
    Budget.objects.create(workspace=team, monthly_limit=Decimal("10"))
    spending = submit(team, owner.user)
    spent_now(spending, "9.96")  # + $0.05 (a minute at $3/h) reaches $10.01

    refused = member.client().post(f"{BASE}/runs/", body("forever"), format="json")

    assert refused.status_code == 409, refused.content
    assert refused.json()["message"] == (
        "workspace budget: $10.00 this month, $9.96 spent, this run has no max_duration and one billing "
        "minute of its cheapest offers costs $0.0500; raise it (trainyard budget set 11), set max_duration, "
        "or submit with --queue"
    )
    Budget.objects.update(monthly_limit=Decimal("10.02"))
    assert member.client().post(f"{BASE}/runs/", body("forever"), format="json").status_code == 201


def test_a_run_within_every_budget_is_made(priced: None, team: Workspace, member: Person) -> None:
    Budget.objects.create(workspace=team, monthly_limit=Decimal("24"))
    Budget.objects.create(workspace=team, user=member.user, monthly_limit=Decimal("24"))
    answer = member.client().post(f"{BASE}/runs/", body(), format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["status_reason"] == "waiting for a runner"


def test_with_queue_the_run_is_made_and_its_jobs_wait_for_budget(priced: None, team: Workspace, member: Person) -> None:
    Budget.objects.create(workspace=team, monthly_limit=Decimal("20"))

    answer = member.client().post(f"{BASE}/runs/", body(queue=True), format="json")

    assert answer.status_code == 201, answer.content
    reason = (
        "waiting for budget: workspace budget: $20.00 this month, $0.00 spent, "
        "this run may cost up to $24.00 (2 jobs × max_duration 4h)"
    )
    assert answer.json()["status_reason"] == reason
    jobs = Job.objects.filter(run__name=answer.json()["name"])
    assert {(j.status, j.status_reason) for j in jobs} == {(JobStatus.PENDING, reason)}


def test_only_an_admin_overrides_the_budgets_and_the_override_is_audited(
    priced: None, team: Workspace, owner: Person, member: Person
) -> None:
    Budget.objects.create(workspace=team, monthly_limit=Decimal("1"))

    refused = member.client().post(f"{BASE}/runs/", body(budget_override=True), format="json")
    assert refused.status_code == 403, refused.content
    assert refused.json()["message"] == (
        "Your role in acme is member: only admins can let a run past the budgets (budget_override, --override-budget)."
    )
    _nothing_written()

    answer = owner.client().post(f"{BASE}/runs/", body(budget_override=True), format="json")
    assert answer.status_code == 201, answer.content
    run = Run.objects.get(name=answer.json()["name"])
    assert run.budget_override is True
    audit = AuditEvent.objects.get(action="budget.override")
    assert (audit.kind, audit.target, audit.username, audit.detail) == (
        AuditKind.BUDGET,
        run.name,
        "olivia",
        {"workflow": "train", "estimate": "24.0000"},
    )


# ------------------------------------------------------------------- max_cost


def test_max_cost_comes_from_the_workflow_and_the_request_wins(priced: None, team: Workspace, member: Person) -> None:
    client = member.client()
    from_key = client.post(f"{BASE}/runs/", body("capped"), format="json")
    assert from_key.status_code == 201, from_key.content
    assert Run.objects.get(name=from_key.json()["name"]).max_cost == Decimal("3.50")
    flagged = client.post(f"{BASE}/runs/", body("capped", max_cost="20"), format="json")
    assert Run.objects.get(name=flagged.json()["name"]).max_cost == Decimal("20.00")
    unset = client.post(f"{BASE}/runs/", body("forever"), format="json")
    assert Run.objects.get(name=unset.json()["name"]).max_cost is None


@pytest.mark.parametrize(
    ("workflow", "max_cost", "status", "message"),
    [
        ("forever", "0.04", 400, "max_cost $0.04 is below one billing minute of job forever's cheapest offer ($0.0500: 60 s at $3.0000/h): no attempt could run. Raise max_cost (workflow key max_cost, trainyard run --max-cost)."),
        ("train", "23.99", 409, "max_cost $23.99 is below what this run may cost: up to $24.00 (2 jobs × max_duration 4h). Raise max_cost or lower max_duration."),
        ("train", "abc", 400, "max_cost: 'abc' is not an amount of USD (write e.g. 500 or 499.99)."),
        ("train", "-1", 400, "max_cost: must be more than $0, got -1."),
        ("train", "0.001", 400, "max_cost: whole cents at most (two decimals), got 0.001."),
    ],
)  # fmt: skip
def test_a_max_cost_the_run_could_never_keep_is_refused_and_writes_nothing(
    priced: None, team: Workspace, member: Person, workflow: str, max_cost: str, status: int, message: str
) -> None:
    answer = member.client().post(f"{BASE}/runs/", body(workflow, max_cost=max_cost, queue=True), format="json")
    assert answer.status_code == status, answer.content
    assert answer.json()["message"] == message
    _nothing_written()


def test_a_max_cost_key_below_a_billing_minute_is_refused(priced: None, team: Workspace, member: Person) -> None:
    text = TWO_JOBS.replace("max_cost: 3.5", "max_cost: 0.01")
    answer = member.client().post(f"{BASE}/runs/", body("capped", text), format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["message"].startswith("max_cost $0.01 is below one billing minute of job capped's")
    _nothing_written()


def test_a_bad_max_cost_key_is_a_workflow_file_error(team: Workspace, member: Person) -> None:
    text = TWO_JOBS.replace("max_cost: 3.5", "max_cost: -3")
    answer = member.client().post(f"{BASE}/runs/", body("capped", text), format="json")
    assert answer.status_code == 400, answer.content
    assert "max_cost" in answer.json()["message"]
    assert "an amount of USD above 0 and at most 10,000,000, got -3" in answer.json()["message"]
    _nothing_written()

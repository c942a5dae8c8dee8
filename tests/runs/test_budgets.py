"""Budgets acted on, against the real database (docs/COST.md, "What happens
at each threshold"): the check that stops a run the way a spot notice does
(``budget_exceeded``, its machine not kept), the notices at the warning and
at 100 % once a month, the scheduler's holds (a budget reached, an estimate
that would pass it, a member's GPU quota), and the resume in place when a
budget is raised or the run is re-run."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from trainyard_runner import protocol

from backend.accounts.models import Membership, Role, Workspace
from backend.billing.models import Budget, BudgetAlert
from backend.clouds.models import Instance, InstanceStatus
from backend.notify.models import Delivery, Subscription
from backend.runs.lifecycle.dispatch import BUDGET_STOP_GRACE
from backend.runs.models import Attempt, Job, JobStatus, Run, RunStatus
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.holds import Holds
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.budgets import budget_raised, budgets_enforce
from tests.support.attempts import accept, current_attempt, report
from tests.support.fixtures import Person, _person, submit

PRICE = Decimal("36")  # $36/h: a cent a second
HELD = 1000  # seconds the running attempt has held its machine: $10.00
WORKFLOWS = """workflows:
  - name: train
    provider: bash
    checkpoint: ./ckpt
    commands: [python train.py]
"""


def _instance(team: Workspace, *, price: Decimal = PRICE, gpus: int = 0) -> Instance:
    n = Instance.objects.count()
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name=f"budget-{n}",
        token_hash=f"{n:064d}",
        status=InstanceStatus.IDLE,
        cpus=8,
        memory_bytes=2**34,
        channel_name="test-channel",
        price_per_hour=price,
        gpus=[{"name": "A10G", "memory_bytes": 2**34}] * gpus,
    )


def _running(team: Workspace, person: Person, *, held: int = HELD, gpus: int = 0) -> tuple[Run, Job, Instance]:
    """A run of ``train`` whose job has held a $36/h machine for ``held`` seconds."""
    run = submit(team, person.user, workflow="train", text=WORKFLOWS)
    instance = _instance(team, gpus=gpus)
    Job.objects.filter(run=run).update(gpu_count=gpus)
    jobs_schedule()
    job = run.jobs.get()
    assert accept(job, instance.pk), job.status_reason
    then = timezone.now() - timedelta(seconds=held)
    Attempt.objects.filter(pk=current_attempt(job).pk).update(started_at=then)
    Instance.objects.filter(pk=instance.pk).update(running_at=then)
    return run, job, instance


def _budget(team: Workspace, limit: str | None, *, user: Person | None = None, **fields: object) -> Budget:
    budget, _ = Budget.objects.update_or_create(
        workspace=team,
        user=user.user if user else None,
        defaults={"monthly_limit": None if limit is None else Decimal(limit), **fields},
    )
    return budget


def test_a_running_job_is_stopped_budget_exceeded_once_its_spend_plus_one_check_reaches_the_budget(
    team: Workspace, owner: Person
) -> None:
    run, job, instance = _running(team, owner)
    # $10.00 spent, $36/h: the next 15 s check adds $0.15. A $10.20 budget is not reached yet.
    _budget(team, "10.20")
    assert budgets_enforce().stopped == []
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING

    _budget(team, "10.10")
    assert budgets_enforce().stopped == [run.name]
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPING
    assert job.stop_reason == TerminationReason.BUDGET_EXCEEDED
    assert job.status_reason.startswith("stopped by the budget: workspace budget $10.10 reached ($10.0")
    # The runner stops the commands, syncs the checkpoint, then reports.
    assert report(job, instance.pk, "stopped", -15, "stopped")
    job.refresh_from_db()
    run.refresh_from_db()
    attempt = Attempt.objects.get(job=job, number=1)
    assert (attempt.termination_reason, job.status, run.status) == ("budget_exceeded", "stopped", "stopped")
    assert run.status_reason.startswith("stopped by the budget: workspace budget $10.10")
    # Not retried on its own, and its machine is not kept idle for reuse.
    assert Attempt.objects.filter(job=job).count() == 1
    instance.refresh_from_db()
    assert instance.idle_duration == 0
    assert budgets_enforce().stopped == []


def test_the_stop_tells_the_runner_to_give_the_commands_time_for_their_checkpoint(
    team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    from backend.runs.lifecycle import dispatch

    sent: list[str] = []
    monkeypatch.setattr(dispatch, "send_to_channel", lambda channel, message: sent.append(message["frame"]))
    _running(team, owner)
    _budget(team, "5")
    with django_capture_on_commit_callbacks(execute=True):
        budgets_enforce()
    [cancel] = [protocol.CancelJob.model_validate_json(f) for f in sent if '"cancel_job"' in f]
    assert cancel.grace == BUDGET_STOP_GRACE > 0
    assert cancel.reason.startswith("stopped by the budget: workspace budget $5.00 reached")


def test_a_member_budget_counts_only_their_runs_and_a_max_cost_only_its_run(
    team: Workspace, owner: Person, member: Person
) -> None:
    mine, _, _ = _running(team, owner)
    theirs, _, _ = _running(team, member, held=100)  # $1.00
    _budget(team, "5", user=member)  # mateo has spent $1.00
    assert budgets_enforce().stopped == []
    _budget(team, "1.10", user=member)
    assert budgets_enforce().stopped == [theirs.name]
    capped, _, _ = _running(team, owner, held=200)  # $2.00
    Run.objects.filter(pk=capped.pk).update(max_cost=Decimal("2.05"))
    assert budgets_enforce().stopped == [capped.name]
    assert Job.objects.get(run=capped).status_reason.startswith("stopped by the budget: the run's max_cost $2.05")
    assert Job.objects.get(run=mine).status == JobStatus.RUNNING


def test_an_admins_override_exempts_the_run_from_the_workspace_budget_but_not_its_max_cost(
    team: Workspace, owner: Person
) -> None:
    run, _, _ = _running(team, owner)
    Run.objects.filter(pk=run.pk).update(budget_override=True)
    _budget(team, "1")
    assert budgets_enforce().stopped == []
    Run.objects.filter(pk=run.pk).update(max_cost=Decimal("9"))
    assert budgets_enforce().stopped == [run.name]


def test_the_warning_and_the_100_percent_notices_go_once_a_month(
    team: Workspace, owner: Person, django_capture_on_commit_callbacks: Any
) -> None:
    Subscription.objects.create(
        workspace=team, kind="webhook", target="https://hooks.example.com/x", events=["budget.80", "budget.100"]
    )
    _running(team, owner)  # $10.00 spent
    budget = _budget(team, "12")  # 83 %
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            budgets_enforce()
    assert list(BudgetAlert.objects.filter(budget=budget).values_list("level", flat=True)) == [80]
    [told] = Delivery.objects.all()
    assert told.event_type == "budget.80"
    data = told.payload["data"]
    assert (data["budget"]["monthly_limit"], data["level"], data["budget"]["user"]) == ("12.00", 80, None)
    _budget(team, "10.05")
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            budgets_enforce()
    assert sorted(BudgetAlert.objects.filter(budget=budget).values_list("level", flat=True)) == [80, 100]
    assert sorted(Delivery.objects.values_list("event_type", flat=True)) == ["budget.100", "budget.80"]


def test_a_raised_budget_resumes_the_run_it_stopped_on_the_same_job(team: Workspace, owner: Person) -> None:
    run, job, instance = _running(team, owner)
    _budget(team, "10.10")
    budgets_enforce()
    assert report(job, instance.pk, "stopped", -15, "stopped")
    # Raised, but not by the billing minute ($0.60) a machine like its last costs: nothing resumes.
    _budget(team, "10.50")
    assert budget_raised(team.pk, None) == []
    _budget(team, "50")
    assert budget_raised(team.pk, None) == [run.name]
    job.refresh_from_db()
    run.refresh_from_db()
    assert (job.status, job.attempt, job.stop_reason, job.finished_at) == ("pending", 1, "", None)
    assert run.status == RunStatus.RUNNING and run.finished_at is None
    # The next pass gives it attempt 2 on the idle machine.
    jobs_schedule()
    job.refresh_from_db()
    assert (job.status, job.attempt) == ("assigned", 2)


def test_a_removed_member_budget_resumes_only_that_members_runs(team: Workspace, owner: Person, member: Person) -> None:
    theirs, job, instance = _running(team, member)
    _budget(team, "5", user=member)
    assert budgets_enforce().stopped == [theirs.name]
    assert report(job, instance.pk, "stopped", -15, "stopped")
    assert budget_raised(team.pk, owner.user.pk) == []
    Budget.objects.filter(user=member.user).delete()
    assert budget_raised(team.pk, member.user.pk) == [theirs.name]


def test_rerun_of_a_run_the_budget_stopped_resumes_it_in_place(team: Workspace, owner: Person) -> None:
    run, job, instance = _running(team, owner)
    _budget(team, "10.10")
    budgets_enforce()
    assert report(job, instance.pk, "stopped", -15, "stopped")
    answer = owner.client().post(f"/api/v1/workspaces/{team.slug}/runs/{run.name}/rerun/")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["name"], body["resumed"]) == (run.name, ["train"])
    assert Run.objects.filter(workspace=team).count() == 1
    # No room for another billing minute of its $36/h machine: the job waits, with the numbers.
    jobs_schedule()
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert job.status_reason.startswith("waiting for budget: workspace budget $10.10, $10.0")
    assert job.status_reason.endswith("spent this month, a billing minute of its last machine costs $0.60")
    # A run stopped by a person is re-run as a new run.
    Budget.objects.filter(workspace=team).delete()
    other = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    owner.client().post(f"/api/v1/workspaces/{team.slug}/runs/{other.name}/stop/")
    again = owner.client().post(f"/api/v1/workspaces/{team.slug}/runs/{other.name}/rerun/")
    assert again.status_code == 201 and again.json()["name"] != other.name and again.json()["resumed"] == []


def test_a_pending_job_waits_for_budget_when_spent_reached_it_or_its_estimate_would_pass_it(
    team: Workspace, owner: Person
) -> None:
    _running(team, owner)  # $10.00 spent
    _budget(team, "10")
    waiting = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    _instance(team)  # an idle machine the next job fits
    jobs_schedule()
    job = waiting.jobs.get()
    assert job.status == JobStatus.PENDING
    assert job.status_reason.startswith("waiting for budget: workspace budget $10.00 reached ($10.0")

    _budget(team, "20")
    Job.objects.filter(pk=job.pk).update(estimate_max_cost=Decimal("12.5"))
    jobs_schedule()
    job.refresh_from_db()
    assert job.status_reason.startswith("waiting for budget: workspace budget $20.00, $10.0")
    assert job.status_reason.endswith(" spent this month, this job may cost up to $12.50")
    _budget(team, "30")
    jobs_schedule()
    job.refresh_from_db()
    assert job.status == JobStatus.ASSIGNED


def test_a_gpu_job_waits_for_its_submitters_quota_and_starts_when_the_first_ends(
    team: Workspace, owner: Person
) -> None:
    _budget(team, None, user=owner, gpu_quota=1)
    _, job, instance = _running(team, owner, gpus=1)
    second = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    Job.objects.filter(run=second).update(gpu_count=1)
    _instance(team, gpus=1)  # an idle GPU machine the next job fits
    jobs_schedule()
    waiting = second.jobs.get()
    assert waiting.status == JobStatus.PENDING
    assert waiting.status_reason == "waiting for GPU quota: olivia's 1 GPU is in use (quota 1, this job needs 1)"
    assert report(job, instance.pk, "succeeded", 0)
    jobs_schedule()
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.ASSIGNED


def test_two_gpu_jobs_of_one_pass_cannot_both_take_the_last_gpu(team: Workspace, owner: Person) -> None:
    _budget(team, None, user=owner, gpu_quota=1)
    runs = [submit(team, owner.user, workflow="train", text=WORKFLOWS) for _ in range(2)]
    Job.objects.filter(run__in=runs).update(gpu_count=1)
    _instance(team, gpus=1)
    _instance(team, gpus=1)
    jobs_schedule()
    statuses = sorted(Job.objects.filter(run__in=runs).values_list("status", flat=True))
    assert statuses == ["assigned", "pending"]


def test_the_holds_of_a_pass_are_read_in_the_same_few_queries_for_5_or_50_jobs(team: Workspace, owner: Person) -> None:
    _budget(team, "100")
    _budget(team, "50", user=owner, gpu_quota=2)
    Membership.objects.create(workspace=team, user=_person("tess").user, role=Role.MEMBER)
    counts = []
    for n in (5, 50):
        runs = [submit(team, owner.user, workflow="train", text=WORKFLOWS) for _ in range(n)]
        Run.objects.filter(pk__in=[r.pk for r in runs]).update(max_cost=Decimal("10"))
        ids = list(Job.objects.filter(run__in=runs).values_list("pk", flat=True))
        with CaptureQueriesContext(connection) as queries:
            Holds.read(ids)
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_an_admin_raising_the_budget_through_the_api_resumes_the_run(
    team: Workspace, owner: Person, django_capture_on_commit_callbacks: Any
) -> None:
    run, job, instance = _running(team, owner)
    path = f"/api/v1/workspaces/{team.slug}/budgets/workspace/"
    assert owner.client().put(path, {"monthly_limit": "10.10"}, format="json").status_code == 200
    budgets_enforce()
    assert report(job, instance.pk, "stopped", -15, "stopped")
    with django_capture_on_commit_callbacks(execute=True):
        assert owner.client().put(path, {"monthly_limit": "60"}, format="json").status_code == 200
    job.refresh_from_db()
    run.refresh_from_db()
    assert (job.status, run.status) == ("pending", "running")

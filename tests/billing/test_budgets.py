"""Setting budgets: the service's rules (bad input names the field and
saves nothing; each change audited in its transaction; a raised or removed
limit sends ``budget_raised`` once committed) and the budgets' API
(everyone of the workspace reads, admins write, another workspace never)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from backend.accounts.models import AuditEvent, AuditKind, Membership, Role, Workspace
from backend.accounts.services.audit import Actor
from backend.billing.models import Budget
from backend.billing.services import budget_remove, budget_set
from backend.billing.signals import budget_raised
from backend.clouds.models import Instance, InstanceStatus
from backend.core.errors import ApplicationError
from backend.runs.models import Attempt, AttemptStatus, Job, JobStatus, Run
from tests.support.fixtures import Person, submit

BASE = "/api/v1/workspaces/acme"


def spent_now(run: Run, amount: str) -> Attempt:
    """An attempt of ``run``'s first job that cost ``amount`` this month: a
    machine priced so that its 60 s minimum is exactly ``amount``, held the
    whole minute (no idle), ending 30 s ago."""
    pk = uuid.uuid4()
    start = timezone.now() - timedelta(seconds=90)
    end = start + timedelta(seconds=60)
    machine = Instance.objects.create(
        id=pk,
        workspace=run.workspace,
        backend="aws",
        name=f"m-{pk.hex[:6]}",
        token_hash=pk.hex,
        price_per_hour=Decimal(amount) * 60,
        running_at=start,
        terminated_at=end,
        status=InstanceStatus.TERMINATED,
    )
    job = run.jobs.order_by("created_at").first()
    assert job is not None
    return Attempt.objects.create(
        workspace=run.workspace,
        job=job,
        number=job.attempts.count() + 1,
        instance=machine,
        status=AttemptStatus.ENDED,
        started_at=start,
        finished_at=end,
    )


@pytest.fixture
def raised() -> Iterator[list[dict[str, Any]]]:
    heard: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs)

    budget_raised.connect(receiver, weak=False)
    yield heard
    budget_raised.disconnect(receiver)


def _actor(person: Person) -> Actor:
    return Actor(user=person.user, address="10.0.0.9")


# ------------------------------------------------------------------- service


def test_a_budget_set_is_saved_and_audited_with_before_and_after(team: Workspace, owner: Person) -> None:
    budget = budget_set(workspace=team, member=None, changes={"monthly_limit": "500"}, actor=_actor(owner))
    budget_set(workspace=team, member=None, changes={"warn_percent": 90}, actor=_actor(owner))

    budget.refresh_from_db()
    assert (budget.monthly_limit, budget.gpu_quota, budget.warn_percent) == (Decimal("500.00"), None, 90)
    assert budget.updated_by == owner.user
    first, second = AuditEvent.objects.filter(kind=AuditKind.BUDGET).order_by("created_at")
    assert (first.action, first.target, first.username, first.address) == (
        "budget.set",
        "the workspace",
        "olivia",
        "10.0.0.9",
    )
    assert first.detail == {
        "before": None,
        "after": {"monthly_limit": "500.00", "gpu_quota": None, "warn_percent": 80},
    }
    assert second.detail["before"]["warn_percent"] == 80 and second.detail["after"]["warn_percent"] == 90


def test_raising_or_removing_a_limit_tells_runs_once_committed_and_lowering_does_not(
    team: Workspace,
    owner: Person,
    member: Person,
    raised: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    def change(who: Person | None, **changes: Any) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            budget_set(workspace=team, member=who and who.user, changes=changes, actor=_actor(owner))

    change(None, monthly_limit="500")  # a new cap gives no room
    change(None, monthly_limit="400")  # lowered
    change(None, warn_percent=60)  # the same limit
    assert raised == []
    change(None, monthly_limit="450.50")
    change(member, monthly_limit="50", gpu_quota=2)
    change(member, monthly_limit=None)  # the quota stays, the cap is off
    with django_capture_on_commit_callbacks(execute=True):
        budget_remove(workspace=team, member=None, actor=_actor(owner))
    assert raised == [
        {"signal": budget_raised, "workspace_id": team.pk, "user_id": None},
        {"signal": budget_raised, "workspace_id": team.pk, "user_id": member.user.pk},
        {"signal": budget_raised, "workspace_id": team.pk, "user_id": None},
    ]
    assert [e.action for e in AuditEvent.objects.filter(kind=AuditKind.BUDGET).order_by("created_at")] == [
        *["budget.set"] * 6,
        "budget.removed",
    ]


def test_a_refused_change_sends_nothing_and_a_rolled_back_one_neither(
    team: Workspace, owner: Person, raised: list[dict[str, Any]], django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        budget_set(workspace=team, member=None, changes={"monthly_limit": "100"}, actor=_actor(owner))
    with django_capture_on_commit_callbacks(execute=True) as callbacks, pytest.raises(ApplicationError):
        budget_set(
            workspace=team, member=None, changes={"monthly_limit": "200", "warn_percent": 0}, actor=_actor(owner)
        )
    assert callbacks == [] and raised == []
    assert Budget.objects.get().monthly_limit == Decimal("100.00")


# ----------------------------------------------------------------------- API


@pytest.mark.parametrize(
    ("for_member", "changes", "message"),
    [
        (False, {"monthly_limit": "-5"}, "monthly_limit: must be more than $0, got -5."),
        (False, {"monthly_limit": 0}, "monthly_limit: must be more than $0, got 0."),
        (False, {"monthly_limit": "lots"}, "monthly_limit: 'lots' is not an amount of USD (write e.g. 500 or 499.99)."),
        (False, {"monthly_limit": "NaN"}, "monthly_limit: 'NaN' is not an amount of USD (write e.g. 500 or 499.99)."),
        (False, {"monthly_limit": True}, "monthly_limit: expected an amount of USD such as 500 or 499.99, got true."),
        (False, {"monthly_limit": [5]}, "monthly_limit: expected an amount of USD such as 500 or 499.99, got [5]."),
        (False, {"monthly_limit": "10000000.01"}, "monthly_limit: at most $10,000,000, got 10000000.01."),
        (False, {"monthly_limit": "9.999"}, "monthly_limit: whole cents at most (two decimals), got 9.999."),
        (False, {"monthly_limit": None}, "a budget needs a monthly_limit: to take the cap off, remove the budget (DELETE, trainyard budget rm)."),
        (False, {"monthly_limit": "5", "warn_percent": 100}, "warn_percent: a whole percent from 1 to 99, got 100."),
        (False, {"monthly_limit": "5", "warn_percent": "80"}, "warn_percent: a whole percent from 1 to 99, got '80'."),
        (False, {"monthly_limit": "5", "limit": 3}, "unknown field 'limit'; a budget has monthly_limit, gpu_quota, warn_percent."),
        (False, {"gpu_quota": 4}, "gpu_quota is a member's (the GPUs their running jobs hold at once): set it on their budget (PUT …/budgets/<username>/, trainyard budget set … --user NAME --gpus N)."),
        (True, {"gpu_quota": -1}, "gpu_quota: a whole number of GPUs from 0 to 10000, or null, got -1."),
        (True, {"gpu_quota": 2.5}, "gpu_quota: a whole number of GPUs from 0 to 10000, or null, got 2.5."),
        (True, {"warn_percent": 50}, "a budget needs a monthly_limit or a gpu_quota: to take the cap off, remove the budget (DELETE, trainyard budget rm)."),
    ],
)  # fmt: skip
def test_bad_input_is_a_400_naming_the_field_and_saves_nothing(
    owner: Person, member: Person, for_member: bool, changes: dict[str, Any], message: str
) -> None:
    path = f"{BASE}/budgets/mateo/" if for_member else f"{BASE}/budgets/workspace/"
    answer = owner.client().put(path, changes, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["message"] == message
    assert Budget.objects.count() == 0
    assert not AuditEvent.objects.filter(kind=AuditKind.BUDGET).exists()


def test_the_budgets_show_the_workspace_first_then_members_by_name_with_this_months_measure(
    team: Workspace, owner: Person, member: Person, viewer: Person
) -> None:
    mine = submit(team, member.user, workflow="big")  # one V100
    spent_now(mine, "12.34")
    spent_now(submit(team, owner.user), "30.00")
    Job.objects.filter(run=mine).update(status=JobStatus.RUNNING)
    admin = owner.client()
    assert admin.put(f"{BASE}/budgets/workspace/", {"monthly_limit": "100"}, format="json").status_code == 200
    put = admin.put(f"{BASE}/budgets/mateo/", {"monthly_limit": "20", "gpu_quota": 4}, format="json")
    assert put.status_code == 200, put.content
    assert admin.put(f"{BASE}/budgets/olivia/", {"gpu_quota": 0}, format="json").status_code == 200

    answer = viewer.client().get(f"{BASE}/budgets/")

    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["currency"], body["month"]) == ("USD", timezone.now().strftime("%Y-%m"))
    workspace, mateo, olivia = body["budgets"]
    assert workspace == {
        "user": None,
        "monthly_limit": "100.00",
        "gpu_quota": None,
        "warn_percent": 80,
        "spent": "42.3400",
        "rate_per_hour": "0.0000",  # no machine runs now
        "percent": 42.3,
        "gpus_running": 1,
    }
    assert (mateo["user"], mateo["spent"], mateo["percent"], mateo["gpus_running"], mateo["gpu_quota"]) == (
        "mateo",
        "12.3400",
        61.7,
        1,
        4,
    )
    assert put.json() == mateo
    assert (olivia["user"], olivia["monthly_limit"], olivia["percent"], olivia["spent"]) == (
        "olivia",
        None,
        None,
        "30.0000",
    )


def test_a_workspace_without_budgets_shows_its_spend_only(team: Workspace, member: Person) -> None:
    (row,) = member.client().get(f"{BASE}/budgets/").json()["budgets"]
    assert row == {
        "user": None,
        "monthly_limit": None,
        "gpu_quota": None,
        "warn_percent": 80,
        "spent": "0.0000",
        "rate_per_hour": "0.0000",
        "percent": None,
        "gpus_running": 0,
    }


def test_only_admins_change_budgets_and_no_one_of_another_workspace_sees_them(
    team: Workspace, owner: Person, member: Person, viewer: Person, outsider: Person
) -> None:
    body = {"monthly_limit": "500"}
    for person, why in ((member, "is member: only admins can make this change"), (viewer, "is viewer: it cannot")):
        answer = person.client().put(f"{BASE}/budgets/workspace/", body, format="json")
        assert answer.status_code == 403, answer.content
        assert why in answer.json()["message"]
    assert member.client().delete(f"{BASE}/budgets/workspace/").status_code == 403
    other = Workspace.objects.create(slug="other", name="Other")
    Membership.objects.create(workspace=other, user=outsider.user, role=Role.ADMIN)
    assert outsider.client().get(f"{BASE}/budgets/").status_code == 404
    assert outsider.client().put(f"{BASE}/budgets/workspace/", body, format="json").status_code == 404
    assert Budget.objects.count() == 0
    # An admin of acme names only acme's members.
    answer = owner.client().put(f"{BASE}/budgets/oscar/", body, format="json")
    assert (answer.status_code, answer.json()["message"]) == (404, "'oscar' is not a member of acme.")


def test_a_budget_removed_is_gone_and_removing_it_again_is_a_404(team: Workspace, owner: Person) -> None:
    admin = owner.client()
    admin.put(f"{BASE}/budgets/workspace/", {"monthly_limit": "500"}, format="json")
    assert admin.delete(f"{BASE}/budgets/workspace/").status_code == 204
    assert Budget.objects.count() == 0
    again = admin.delete(f"{BASE}/budgets/workspace/")
    assert (again.status_code, again.json()["message"]) == (404, "the workspace has no budget in acme.")
    removed = AuditEvent.objects.get(action="budget.removed")
    assert removed.detail["before"]["monthly_limit"] == "500.00"

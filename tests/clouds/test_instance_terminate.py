"""An admin ends a machine by name: ``POST …/instances/<name>/terminate/`` and
``trainyard instances terminate`` go through the retire path (terminating, then
the backend's terminate), audited once; members cannot, another workspace's
machine is not found, a self-hosted one is revoked instead (``trainyard runners
revoke``). Fake backend, state only."""

from __future__ import annotations

from typing import Any

import pytest

from backend.accounts.models import AuditEvent, Workspace
from backend.clouds.backends.base import CloudState
from backend.clouds.models import CloudAccount, Instance, InstanceReason, InstanceStatus
from backend.clouds.services.accounts import compute_of
from backend.clouds.services.instances import handle_of
from backend.clouds.services.provisioning import instance_launch_run, instance_terminate_run
from backend.runs.scheduler.passes import jobs_schedule
from tests.billing.test_selfhosted_price import registered
from tests.support.cli_wsgi import cli_as, cli_invoke, in_the_tests_transaction
from tests.support.fixtures import Person, submit

GIB = 2**30
WS = "/api/v1/workspaces/acme"
WORKFLOWS = "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n"
OFFER = {"instance_type": "fake-a", "region": "r1", "price_per_hour": 0.1, "cpus": 2, "memory_bytes": 4 * GIB}


@pytest.fixture
def machine(fake_account: Any, team: Workspace, owner: Person) -> Instance:
    fake_account([OFFER])
    submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()
    instance_launch_run(instance_id=str(instance.pk))
    instance.refresh_from_db()
    return instance


def test_an_admin_terminates_a_machine_by_name_and_the_backend_ends_it(machine: Instance, owner: Person) -> None:
    answer = owner.client().post(f"{WS}/instances/{machine.name}/terminate/")

    assert answer.status_code == 202, answer.json()
    assert (answer.json()["name"], answer.json()["status"]) == (machine.name, "terminating")
    machine.refresh_from_db()
    assert (machine.termination_reason, machine.status_reason) == (
        InstanceReason.TERMINATE_REQUESTED,
        f"terminated by {owner.user.username}",
    )
    instance_terminate_run(instance_id=str(machine.pk))  # the task the request queued
    machine.refresh_from_db()
    assert machine.status == InstanceStatus.TERMINATED
    account = CloudAccount.objects.get()
    assert compute_of(account).describe([handle_of(machine)])[machine.idempotency_key] in {
        CloudState.TERMINATED,
        CloudState.NOT_FOUND,
    }
    # Asked again while terminating: the same answer, no second audit entry; once ended: said so.
    events = AuditEvent.objects.filter(action="instance.terminated", target=machine.name)
    assert [(e.kind, e.username) for e in events] == [("backend", owner.user.username)]
    again = owner.client().post(f"{WS}/instances/{machine.name}/terminate/")
    assert (again.status_code, again.json()["message"]) == (409, f"{machine.name} is already terminated.")


def test_asking_twice_while_it_terminates_is_one_request_and_one_audit_entry(machine: Instance, owner: Person) -> None:
    first = owner.client().post(f"{WS}/instances/{machine.name}/terminate/")
    second = owner.client().post(f"{WS}/instances/{machine.name}/terminate/")
    assert (first.status_code, second.status_code, second.json()["status"]) == (202, 202, "terminating")
    assert AuditEvent.objects.filter(action="instance.terminated").count() == 1


def test_a_member_may_not_terminate_and_an_unknown_name_is_named(
    machine: Instance, member: Person, owner: Person
) -> None:
    refused = member.client().post(f"{WS}/instances/{machine.name}/terminate/")
    assert refused.status_code == 403
    assert "only admins can make this change" in refused.json()["message"]
    missing = owner.client().post(f"{WS}/instances/no-such-box/terminate/")
    assert (missing.status_code, missing.json()["message"]) == (
        404,
        "No instance named 'no-such-box' in this workspace (see `trainyard instances --all`).",
    )
    machine.refresh_from_db()
    assert machine.status != InstanceStatus.TERMINATING


def test_another_workspaces_machine_is_not_found_under_ones_own(machine: Instance, outsider: Person) -> None:
    own = outsider.user.personal_workspace.slug
    answer = outsider.client().post(f"/api/v1/workspaces/{own}/instances/{machine.name}/terminate/")
    assert answer.status_code == 404
    machine.refresh_from_db()
    assert machine.status != InstanceStatus.TERMINATING


def test_trainyard_instances_terminate_asks_then_ends_the_machine(
    machine: Instance, team: Workspace, owner: Person, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.ALLOWED_HOSTS = ["*"]
    cli_as(monkeypatch, team, owner)
    with in_the_tests_transaction():
        code, _, err = cli_invoke("instances", "terminate", machine.name, stdin="n\n")
        assert (code, f"Terminate instance {machine.name}" in err, "Aborted!" in err) == (1, True, True), err
        machine.refresh_from_db()
        assert machine.status != InstanceStatus.TERMINATING

        code, _, err = cli_invoke("instances", "terminate", machine.name, stdin="y\n")
        assert (code, err.splitlines()[-1]) == (
            0,
            f"Instance {machine.name} is terminating: the backend is terminating it.",
        )
        code, _, err = cli_invoke("instances", "terminate", "-y", "no-such-box")
        assert (code, err) == (
            1,
            "error: No instance named 'no-such-box' in this workspace (see `trainyard instances --all`).\n",
        )
    machine.refresh_from_db()
    assert machine.status == InstanceStatus.TERMINATING


def test_trainyard_runners_revokes_a_self_hosted_machine_and_runner_is_the_same_command(
    team: Workspace, owner: Person, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}
    box = registered(owner, name="lab-box")
    settings.ALLOWED_HOSTS = ["*"]
    cli_as(monkeypatch, team, owner)
    with in_the_tests_transaction():
        code, out, _ = cli_invoke("runner", "ls")  # the old name lists the same
        assert out.splitlines()[1].split()[:2] == ["lab-box", "idle"]
        code, _, err = cli_invoke("instances", "terminate", "-y", "lab-box")
        assert (code, err) == (
            1,
            "error: lab-box is a self-hosted machine: it is not Trainyard's to terminate; "
            "revoke its runner instead (`trainyard runners revoke lab-box`).\n",
        )
        code, _, err = cli_invoke("runners", "revoke", "lab-box", "-y")
        assert (code, err) == (0, "Revoked runner lab-box.\n")
        code, out, _ = cli_invoke("runners", "ls")
        assert out.splitlines()[1].split()[:2] == ["lab-box", "revoked"]
        code, _, err = cli_invoke("runners", "revoke", "lab-box", "-y")
        assert (code, err) == (
            1,
            "error: No self-hosted runner named 'lab-box' in this workspace (see `trainyard runners ls`).\n",
        )
    box.refresh_from_db()
    assert AuditEvent.objects.filter(action="runner.revoked", target=str(box.pk)).count() == 1

"""Machines nobody needs any more are terminated, also when the need went
away while they were starting (fake backend, state only)."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.clouds.backends.base import CloudState, Compute, Handle, LaunchSpec, Requirements
from backend.clouds.backends.fake.state import FakeState, read_machines
from backend.clouds.backends.registry import compute_for
from backend.clouds.models import CloudAccount, Instance, InstanceEvent, InstanceReason, InstanceStatus
from backend.clouds.services.accounts import account_config, compute_of
from backend.clouds.services.instances import handle_of, instance_request_termination
from backend.clouds.services.provisioning import instance_launch_run, instance_terminate_run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.runs import run_stop
from tests.support.accounttasks import reconcile_with_account_tasks
from tests.support.fixtures import Person, submit

GIB = 2**30
WORKFLOWS = "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n"
OFFER = {"instance_type": "fake-a", "region": "r1", "price_per_hour": 0.1, "cpus": 2, "memory_bytes": 4 * GIB}


@pytest.fixture
def fake(fake_account: Any) -> Any:
    return fake_account([OFFER])


def test_stopping_a_run_while_its_machine_starts_terminates_the_machine(
    fake: CloudAccount, team: Workspace, owner: Person
) -> None:
    run = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()
    instance_launch_run(instance_id=str(instance.pk))

    run_stop(run=run, user=owner.user)
    reconcile_with_account_tasks()

    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == (
        InstanceStatus.TERMINATING,
        InstanceReason.TERMINATE_REQUESTED,
    )
    assert "not needed any more: job train stopped" in instance.status_reason
    instance_terminate_run(instance_id=str(instance.pk))
    assert compute_of(fake).describe([handle_of(instance)])[instance.idempotency_key] in {
        CloudState.TERMINATED,
        CloudState.NOT_FOUND,
    }


@pytest.mark.django_db(transaction=True)
def test_a_launch_that_returns_after_its_row_moved_on_terminates_what_it_started(
    fake: CloudAccount, team: Workspace, owner: Person, script: Path
) -> None:
    script.write_text('{"launch_delay": 1.5}')
    submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()

    def launch() -> None:
        try:
            instance_launch_run(instance_id=str(instance.pk))
        finally:
            connection.close()

    launching = threading.Thread(target=launch)
    launching.start()
    time.sleep(0.5)  # the backend call is under way
    instance_request_termination(
        instance_id=str(instance.pk), reason=InstanceReason.TERMINATE_REQUESTED, message="cancelled"
    )
    launching.join(10)

    instance.refresh_from_db()
    assert instance.status == InstanceStatus.TERMINATING
    assert instance.backend_id, "the late launch's machine is recorded, so it can be found again"
    assert compute_of(fake).describe([handle_of(instance)])[instance.idempotency_key] in {
        CloudState.STOPPING,
        CloudState.TERMINATED,
    }


def test_a_termination_the_cloud_does_not_confirm_is_retried_and_after_15_minutes_says_so(
    fake: CloudAccount, team: Workspace, owner: Person, script: Path
) -> None:
    script.write_text('{"terminate_delay": 3600}')
    run = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()
    instance_launch_run(instance_id=str(instance.pk))
    run_stop(run=run, user=owner.user)
    reconcile_with_account_tasks()
    assert instance_terminate_run(instance_id=str(instance.pk)) is not None, "not yet: asked again later"

    long_ago = timezone.now() - timedelta(minutes=16)
    InstanceEvent.objects.filter(instance=instance, to_status=InstanceStatus.TERMINATING).update(created_at=long_ago)
    Instance.objects.filter(pk=instance.pk).update(terminate_requested_at=long_ago)
    reconcile_with_account_tasks()

    instance.refresh_from_db()
    assert instance.status == InstanceStatus.TERMINATING
    assert instance.status_reason.startswith("still not terminated after 16 min")
    assert instance.terminate_requested_at is not None and instance.terminate_requested_at > long_ago
    script.write_text("{}")


def test_the_leak_sweep_terminates_an_old_machine_of_ours_with_no_row_and_leaves_young_and_foreign_ones(
    fake: CloudAccount, team: Workspace, owner: Person, tmp_path: Path, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LEAK_SWEEP_SECONDS": 0.0}
    compute = compute_of(fake)
    offer = next(iter(compute.offers(Requirements())))

    foreign = compute_for(dataclasses.replace(account_config(fake), installation="ty-another-installation"))

    def machine(key: str, backend: Compute) -> None:
        spec = LaunchSpec(
            idempotency_key=key,
            instance_name=key,
            runner_token="t",
            server_url="http://127.0.0.1:1",
            tags={"trainyard:installation": backend.account.installation},
        )
        backend.launch(offer, spec)

    machine("ty-orphan-old", compute)
    machine("ty-orphan-young", compute)
    machine("ty-foreign-old", foreign)
    state_dir = Path(str(fake.config["state_dir"]))
    old = FakeState(state_dir)
    with old.locked():
        for key in ("ty-orphan-old", "ty-foreign-old"):
            aged = old.machine(key)
            assert aged is not None
            old.save(dataclasses.replace(aged, launched_at=time.time() - 601))

    reconcile_with_account_tasks()

    alive = {h.key for h in compute.list_managed()}
    assert alive == {"ty-orphan-young"}, "the old orphan is terminated, the young one left for now"
    untouched = {m.key for m in read_machines(state_dir) if m.terminate_requested_at is None}
    assert untouched == {"ty-orphan-young", "ty-foreign-old"}, "another installation's machine is never touched"
    compute.terminate(Handle(key="ty-orphan-young"))
    foreign.terminate(Handle(key="ty-foreign-old"))

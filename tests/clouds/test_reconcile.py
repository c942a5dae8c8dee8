"""Every time-based transition of the reconciler, on the fake backend (state
only): leases, stop grace, silent → unreachable → lost or fenced, a server
that could not hear, idle retirement, stuck and timed-out launches."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.clouds.models import CloudAccount, ControlPlane, Instance, InstanceReason, InstanceStatus, WebPulse
from backend.clouds.services.accounts import compute_of
from backend.clouds.services.instances import Facts, instance_connected, instance_heartbeat
from backend.clouds.services.provisioning import instance_launch_run, instance_terminate_run
from backend.runs.models import Attempt, AttemptStatus, Job, JobStatus
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.runs import run_stop
from tests.support.accounttasks import reconcile_with_account_tasks
from tests.support.attempts import accept
from tests.support.fixtures import Person, submit

GIB = 2**30
WORKFLOWS = "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n"
OFFER = {"instance_type": "fake-a", "region": "r1", "price_per_hour": 0.1, "cpus": 2, "memory_bytes": 4 * GIB}


@pytest.fixture
def fake(fake_account: Any) -> Any:
    return fake_account([OFFER])


@pytest.fixture
def hearing() -> None:
    """A server that has been hearing for a while: a fresh web pulse, a recent pass."""
    now = timezone.now()
    WebPulse.objects.create(process="web:1", at=now)
    ControlPlane.objects.create(reconciled_at=now - timedelta(seconds=1), hearing_since=now - timedelta(hours=1))


def _pulse() -> None:
    WebPulse.objects.update(at=timezone.now())
    ControlPlane.objects.update(reconciled_at=timezone.now() - timedelta(seconds=1))


def _running(team: Workspace, owner: Person, *, accepted: bool = True) -> tuple[Job, Instance]:
    run = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()
    instance_launch_run(instance_id=str(instance.pk))
    facts = Facts("box", "10.0.0.1", "test", 2, 4 * GIB, 50 * GIB, [])
    instance_connected(instance_id=str(instance.pk), channel_name="c", facts=facts, busy=False)
    jobs_schedule()
    job = run.jobs.get()
    if accepted:
        assert accept(job, instance.pk)
    job.refresh_from_db()
    instance.refresh_from_db()
    return job, instance


def _ago(seconds: float) -> Any:
    return timezone.now() - timedelta(seconds=seconds)


def test_an_expired_lease_ends_the_attempt_and_requeues_without_counting(
    fake: CloudAccount, hearing: None, team: Workspace, owner: Person
) -> None:
    job, instance = _running(team, owner, accepted=False)
    Attempt.objects.filter(job=job).update(lease_expires_at=_ago(1))

    reconcile_with_account_tasks()

    job.refresh_from_db()
    attempt = Attempt.objects.get(job=job)
    assert (attempt.status, attempt.termination_reason) == (AttemptStatus.ENDED, "lease_expired")
    assert (job.status, job.instance_id) == (JobStatus.PENDING, None)
    assert job.status_reason.startswith("trying again: attempt 1 ended: the runner did not accept in time")
    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.IDLE


def test_an_unconfirmed_stop_ends_stopped_after_the_grace(
    fake: CloudAccount, hearing: None, team: Workspace, owner: Person, settings: Any
) -> None:
    job, _ = _running(team, owner)
    run_stop(run=job.run, user=owner.user)
    Job.objects.filter(pk=job.pk).update(stop_requested_at=_ago(settings.TRAINYARD["STOP_GRACE_SECONDS"] + 1))

    reconcile_with_account_tasks()

    job.refresh_from_db()
    attempt = Attempt.objects.get(job=job)
    assert job.status == JobStatus.STOPPED
    assert attempt.termination_reason == "stopped_by_user"
    assert "the runner did not confirm within 100s" in attempt.termination_message


def test_a_silent_runner_whose_machine_is_gone_is_lost_and_its_job_retried(
    fake: CloudAccount, hearing: None, script: Path, team: Workspace, owner: Person
) -> None:
    job, instance = _running(team, owner)
    Instance.objects.filter(pk=instance.pk).update(last_heartbeat_at=_ago(6))
    script.write_text(json.dumps({"vanish": [instance.idempotency_key]}))

    reconcile_with_account_tasks()  # silent → unreachable; describe: not_found → lost
    reconcile_with_account_tasks()  # the attempt on the lost machine ends

    instance.refresh_from_db()
    job.refresh_from_db()
    attempt = Attempt.objects.get(job=job)
    assert (instance.status, instance.termination_reason) == (InstanceStatus.LOST, InstanceReason.MACHINE_GONE)
    assert attempt.termination_reason == "instance_lost"
    assert attempt.termination_message == f"machine {instance.name} is gone (the backend says not_found)"
    assert job.status == JobStatus.PENDING
    assert job.status_reason.startswith("retrying (attempt 2 of 5): attempt 1 ended: the machine was lost")
    history = list(instance.events.order_by("created_at").values_list("reason", "to_status"))
    assert history[-2:] == [
        (InstanceReason.SILENT, InstanceStatus.UNREACHABLE),
        (InstanceReason.MACHINE_GONE, InstanceStatus.LOST),
    ]


def test_an_unreachable_runner_whose_machine_is_there_keeps_its_job_for_the_grace_then_is_fenced(
    fake: CloudAccount, hearing: None, team: Workspace, owner: Person, settings: Any
) -> None:
    job, instance = _running(team, owner)
    Instance.objects.filter(pk=instance.pk).update(last_heartbeat_at=_ago(6))

    reconcile_with_account_tasks()
    instance.refresh_from_db()
    job.refresh_from_db()
    assert (instance.status, job.status) == (InstanceStatus.UNREACHABLE, JobStatus.RUNNING)

    grace = compute_of(fake).timings.unreachable_grace  # no TRAINYARD_UNREACHABLE_GRACE_SECONDS: the backend's
    Instance.objects.filter(pk=instance.pk).update(unreachable_since=_ago(grace + 1))
    _pulse()
    reconcile_with_account_tasks()
    reconcile_with_account_tasks()

    instance.refresh_from_db()
    attempt = Attempt.objects.get(job=job)
    assert (instance.status, instance.termination_reason) == (InstanceStatus.LOST, InstanceReason.UNREACHABLE_GRACE)
    assert attempt.termination_reason == "unreachable"
    assert Job.objects.get(pk=job.pk).status == JobStatus.PENDING  # retried elsewhere


def test_silence_while_no_web_process_could_hear_does_not_count(
    fake: CloudAccount, team: Workspace, owner: Person
) -> None:
    job, instance = _running(team, owner)
    ControlPlane.objects.create(reconciled_at=_ago(1), hearing_since=_ago(3600))
    WebPulse.objects.create(process="web:1", at=_ago(60))  # frozen for a minute
    Instance.objects.filter(pk=instance.pk).update(last_heartbeat_at=_ago(60))

    reconcile_with_account_tasks()
    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.BUSY

    WebPulse.objects.update(at=timezone.now())  # the web process is back: silence counts from now
    reconcile_with_account_tasks()
    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.BUSY
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def test_a_gap_in_the_reconcilers_passes_restarts_the_count(fake: CloudAccount, team: Workspace, owner: Person) -> None:
    _, instance = _running(team, owner)
    WebPulse.objects.create(process="web:1", at=timezone.now())
    ControlPlane.objects.create(reconciled_at=_ago(45), hearing_since=_ago(3600))  # beat or the database was down
    Instance.objects.filter(pk=instance.pk).update(last_heartbeat_at=_ago(45))

    reconcile_with_account_tasks()

    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.BUSY
    assert ControlPlane.objects.get().hearing_since > _ago(5)


def test_an_idle_machine_is_retired_after_its_idle_time(
    fake: CloudAccount, hearing: None, team: Workspace, owner: Person, settings: Any
) -> None:
    job, instance = _running(team, owner)
    from tests.support.attempts import report

    report(job, instance.pk, "succeeded", 0)
    idle = compute_of(fake).timings.idle_default  # a fake machine: the backend's idle time
    Instance.objects.filter(pk=instance.pk).update(idle_since=_ago(idle + 1), last_heartbeat_at=timezone.now())

    reconcile_with_account_tasks()

    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == (InstanceStatus.TERMINATING, InstanceReason.IDLE_RETIRED)
    instance_terminate_run(instance_id=str(instance.pk))
    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.TERMINATED


def test_a_launch_nobody_performed_is_given_up_with_a_reason(
    fake: CloudAccount, hearing: None, team: Workspace, owner: Person
) -> None:
    submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    Instance.objects.update(created_at=_ago(3600))

    reconcile_with_account_tasks()

    instance = Instance.objects.get()
    assert (instance.status, instance.termination_reason) == (InstanceStatus.TERMINATED, InstanceReason.LAUNCH_FAILED)
    assert instance.status_reason == "the launch never happened (no worker took it)"


def test_a_machine_whose_runner_never_connects_is_terminated_after_the_timeout(
    fake: CloudAccount, hearing: None, team: Workspace, owner: Person, settings: Any
) -> None:
    submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()
    instance_launch_run(instance_id=str(instance.pk))
    timeout = compute_of(fake).timings.provision_timeout
    Instance.objects.filter(pk=instance.pk).update(launched_at=_ago(timeout + 1))

    reconcile_with_account_tasks()

    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == (
        InstanceStatus.TERMINATING,
        InstanceReason.PROVISION_TIMEOUT,
    )
    assert instance.status_reason == f"runner {instance.name} did not connect within {timeout:.0f}s"


def test_an_unreachable_runner_heard_again_on_the_connection_it_kept_is_not_fenced(
    fake: CloudAccount, hearing: None, team: Workspace, owner: Person
) -> None:
    """A link that froze for longer than the heartbeat timeout but shorter
    than the runner's own: no new hello, just heartbeats again
    (tests/e2e/test_log_faults.py found it: the machine was fenced 120 s later)."""
    job, instance = _running(team, owner)
    Instance.objects.filter(pk=instance.pk).update(last_heartbeat_at=_ago(6))
    reconcile_with_account_tasks()
    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.UNREACHABLE

    instance_heartbeat(instance_id=str(instance.pk), busy=True)

    instance.refresh_from_db()
    assert (instance.status, instance.unreachable_since) == (InstanceStatus.BUSY, None)
    Instance.objects.filter(pk=instance.pk).update(last_heartbeat_at=timezone.now())
    _pulse()
    reconcile_with_account_tasks()
    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.BUSY
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING

"""``job.waiting_capacity``: a job whose offers have no capacity, pending
longer than TRAINYARD_NOTIFY_WAITING_MINUTES, is told once per wait to a
real webhook receiver, through scheduling passes with the fake backend."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.clouds.models import CloudAccount, Instance, InstanceReason, InstanceStatus, OfferBlock
from backend.clouds.services.accounts import compute_of
from backend.clouds.services.instances import Facts, instance_connected
from backend.clouds.services.provisioning import instance_launch_run, instance_terminate_run
from backend.notify.models import Delivery
from backend.notify.services import delivery_send
from backend.runs.lifecycle.transitions import attempt_end
from backend.runs.models import Attempt, Job, JobStatus
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.passes import jobs_schedule
from tests.notify.conftest import Receiver
from tests.support.attempts import accept, current_attempt
from tests.support.fixtures import Person, submit

GIB = 2**30
NOTIFICATIONS = "/api/v1/workspaces/acme/notifications/"
# Why a job short of capacity waits: its last launch found none, or the offer is blocked since.
SHORT = ("no capacity: tried 1 of 1 offers", "waiting for capacity: all 1 offers are blocked")
WORKFLOW = (
    "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n"
    "    retry: {on_events: [no_capacity, interruption], limit: 20}\n"
)


@pytest.fixture
def cloud(team: Workspace, tmp_path: Path, settings: Any) -> Iterator[Callable[[list[str]], None]]:
    """A fake account with one offer, ``a``; the callable says which offers
    have no capacity. Afterwards nothing of ours runs."""
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}
    script = tmp_path / "script.json"
    offers = [{"instance_type": "a", "region": "r1", "price_per_hour": 0.5, "cpus": 2, "memory_bytes": 4 * GIB}]
    config = {"state_dir": str(tmp_path / "state"), "script_file": str(script), "offers": offers}
    account = CloudAccount.objects.create(workspace=team, kind="fake", name="fake", config=config)

    def short_of(types: list[str]) -> None:
        script.write_text(json.dumps({"no_capacity": types}))
        OfferBlock.objects.all().delete()  # a launch that failed blocks its offer for a while

    short_of([])
    yield short_of
    for instance in Instance.objects.filter(account=account):
        instance_terminate_run(instance_id=str(instance.pk))
    assert list(compute_of(account).list_managed()) == []


def passes(n: int, capture: Any) -> None:
    """``n`` scheduling passes, each launch run, each commit's callbacks too;
    between passes the clock of the failed launches moves on past the
    no_capacity back-off (at most 10 minutes)."""
    for _ in range(n):
        with capture(execute=True):
            jobs_schedule()
        for instance in Instance.objects.filter(status=InstanceStatus.PROVISIONING, launched_at=None):
            instance_launch_run(instance_id=str(instance.pk))
        earlier = timedelta(minutes=11)
        Attempt.objects.filter(termination_reason=TerminationReason.NO_CAPACITY).update(
            finished_at=F("finished_at") - earlier
        )
        Instance.objects.filter(termination_reason=InstanceReason.NO_CAPACITY).update(
            created_at=F("created_at") - earlier
        )


def told(receiver: Receiver) -> list[dict[str, Any]]:
    """Send what is due to the receiver; every waiting_capacity body it got."""
    for delivery in Delivery.objects.filter(status="pending"):
        delivery_send(delivery_id=str(delivery.pk))
    return [json.loads(g.body) for g in receiver.got if g.headers["Trainyard-Event"] == "job.waiting_capacity"]


@pytest.mark.usefixtures("private")
def test_a_job_short_of_capacity_is_told_once_per_wait(
    team: Workspace,
    owner: Person,
    receiver: Receiver,
    cloud: Callable[[list[str]], None],
    django_capture_on_commit_callbacks: Any,
) -> None:
    body = {"kind": "webhook", "target": receiver.url, "events": ["job.waiting_capacity"]}
    assert owner.client().post(NOTIFICATIONS, body, format="json").status_code == 201
    cloud(["a"])
    job = submit(team, owner.user, workflow="train", text=WORKFLOW).jobs.get()

    passes(3, django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING and job.status_reason.startswith(SHORT)
    assert told(receiver) == []  # it has waited less than 15 minutes

    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(minutes=16))
    passes(4, django_capture_on_commit_callbacks)

    (first,) = told(receiver)
    assert first["data"]["job"] == {"name": "train", "id": str(job.pk)}
    assert first["data"]["waited_minutes"] == 16
    assert first["data"]["reason"].startswith(SHORT)
    assert first["data"]["run"]["id"] == str(job.run_id)

    # Capacity comes back: it runs, its machine is interrupted, and it waits anew.
    cloud([])
    passes(2, django_capture_on_commit_callbacks)
    machine = Instance.objects.exclude(launched_at=None).get(status=InstanceStatus.PROVISIONING)
    facts = Facts("box", "10.0.0.1", "test", 2, 4 * GIB, 50 * GIB, [])
    assert instance_connected(instance_id=str(machine.pk), channel_name="c", facts=facts, busy=False)
    passes(1, django_capture_on_commit_callbacks)
    assert accept(job, machine.pk)
    cloud(["a"])
    attempt_end(attempt_id=str(current_attempt(job).pk), reason=TerminationReason.INTERRUPTED)
    instance_terminate_run(instance_id=str(machine.pk))
    passes(3, django_capture_on_commit_callbacks)
    assert len(told(receiver)) == 1  # the new wait is young

    Attempt.objects.filter(job=job, termination_reason=TerminationReason.INTERRUPTED).update(
        finished_at=timezone.now() - timedelta(minutes=20)
    )
    passes(3, django_capture_on_commit_callbacks)

    assert [b["data"]["waited_minutes"] for b in told(receiver)] == [16, 20]


@pytest.mark.usefixtures("private")
def test_a_job_waiting_for_something_else_is_not_told(
    team: Workspace,
    owner: Person,
    receiver: Receiver,
    cloud: Callable[[list[str]], None],
    django_capture_on_commit_callbacks: Any,
) -> None:
    body = {"kind": "webhook", "target": receiver.url, "events": ["job.waiting_capacity"]}
    assert owner.client().post(NOTIFICATIONS, body, format="json").status_code == 201
    too_big = WORKFLOW.replace("commands:", "resources: {cpu: 64}\n    commands:")
    job = submit(team, owner.user, workflow="train", text=too_big).jobs.get()
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(hours=1))

    passes(3, django_capture_on_commit_callbacks)

    job.refresh_from_db()
    assert job.status_reason.startswith("no backend can run this job")
    assert told(receiver) == []

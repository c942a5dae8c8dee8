"""Scheduling through the compute seam with the fake backend: offers tried
in price order, capacity failures recorded on the attempt, and shortfalls
named when nothing fits. Machines are state only (no runner processes);
a test plays the runner's hello with ``instance_connected``."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.clouds.models import CloudAccount, Instance, InstanceReason, InstanceStatus
from backend.clouds.services.instances import Facts, instance_connected
from backend.clouds.services.provisioning import instance_launch_run
from backend.runs.models import Attempt, JobStatus, Run
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.fixtures import Person, submit

GIB = 2**30
OFFERS = [
    {"instance_type": "fake-a", "region": "r1", "price_per_hour": 0.10, "cpus": 2, "memory_bytes": 4 * GIB},
    {"instance_type": "fake-b", "region": "r1", "price_per_hour": 0.20, "cpus": 2, "memory_bytes": 4 * GIB},
    {"instance_type": "fake-c", "region": "r1", "price_per_hour": 0.30, "cpus": 2, "memory_bytes": 4 * GIB},
]
GPU_OFFER = {
    "instance_type": "fake-gpu",
    "region": "r1",
    "price_per_hour": 1.0,
    "cpus": 8,
    "memory_bytes": 32 * GIB,
    "disk_bytes": 100 * GIB,
    "gpus": [{"name": "A10G", "memory_bytes": 24 * GIB}],
}


def workflows(resources: str = "", retry: str = "") -> str:
    return (
        "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n"
        + (f"    resources: {resources}\n" if resources else "")
        + (f"    retry: {retry}\n" if retry else "")
    )


@pytest.fixture
def fake(fake_account: Any) -> Any:
    return fake_account([*OFFERS, GPU_OFFER])


def _launch_all() -> None:
    for instance in Instance.objects.filter(status=InstanceStatus.PROVISIONING, launched_at=None):
        instance_launch_run(instance_id=str(instance.pk))


def _hello(instance: Instance) -> None:
    facts = Facts("box", "10.0.0.1", "test", 2, 4 * GIB, 50 * GIB, [])
    assert instance_connected(instance_id=str(instance.pk), channel_name="test-channel", facts=facts, busy=False)


def _schedule_until_launched(passes: int = 5) -> Instance | None:
    for _ in range(passes):
        jobs_schedule()
        _launch_all()
        launched = Instance.objects.filter(status=InstanceStatus.PROVISIONING).exclude(launched_at=None).first()
        if launched is not None:
            return launched
    return None


def test_no_capacity_on_the_two_cheapest_offers_launches_the_third_and_the_attempt_says_why(
    fake: CloudAccount, script: Path, team: Workspace, owner: Person
) -> None:
    script.write_text(json.dumps({"no_capacity": ["fake-a", "fake-b"]}))
    run = submit(team, owner.user, workflow="train", text=workflows())

    instance = _schedule_until_launched()
    assert instance is not None and instance.instance_type == "fake-c"
    _hello(instance)
    jobs_schedule()

    job = run.jobs.get()
    attempt = Attempt.objects.get(job=job)
    assert (job.status, job.attempt, attempt.instance_id) == (JobStatus.ASSIGNED, 1, instance.pk)
    assert [(t["offer"].split("/")[3], t["outcome"]) for t in attempt.offers_tried] == [
        ("fake-a", "no_capacity"),
        ("fake-b", "no_capacity"),
        ("fake-c", "launched"),
    ]
    assert attempt.offers_tried[0]["message"].startswith("fake/r1/r1a/fake-a/on-demand: ")
    failed = Instance.objects.filter(termination_reason=InstanceReason.NO_CAPACITY)
    assert sorted(failed.values_list("instance_type", "status")) == [
        ("fake-a", InstanceStatus.TERMINATED),
        ("fake-b", InstanceStatus.TERMINATED),
    ]
    history = list(instance.events.order_by("created_at").values_list("reason", "to_status"))
    assert history == [
        (InstanceReason.REQUESTED, InstanceStatus.PROVISIONING),
        (InstanceReason.LAUNCHED, InstanceStatus.PROVISIONING),
        (InstanceReason.CONNECTED, InstanceStatus.IDLE),
        (InstanceReason.ASSIGNED, InstanceStatus.BUSY),
    ]


def test_every_offer_without_capacity_fails_the_job_with_the_offers_tried(
    fake: CloudAccount, script: Path, team: Workspace, owner: Person
) -> None:
    script.write_text(json.dumps({"no_capacity": ["fake-a", "fake-b", "fake-c", "fake-gpu"]}))
    run = submit(team, owner.user, workflow="train", text=workflows())

    assert _schedule_until_launched(passes=6) is None

    job = run.jobs.get()
    [attempt] = Attempt.objects.filter(job=job)
    assert job.status == JobStatus.FAILED
    assert attempt.termination_reason == "no_capacity"
    assert job.status_reason.startswith("no capacity: tried 4 of 4 offers (fake/r1/r1a/fake-a/on-demand no_capacity")
    assert len(attempt.offers_tried) == 4
    assert Run.objects.get(pk=run.pk).status == "failed"


def test_with_retry_on_no_capacity_the_job_waits_and_backs_off(
    fake: CloudAccount, script: Path, team: Workspace, owner: Person
) -> None:
    script.write_text(json.dumps({"no_capacity": ["fake-a", "fake-b", "fake-c", "fake-gpu"]}))
    run = submit(team, owner.user, workflow="train", text=workflows(retry="{on_events: [no_capacity]}"))

    _schedule_until_launched(passes=6)

    job = run.jobs.get()
    assert job.status == JobStatus.PENDING
    assert Attempt.objects.filter(job=job, termination_reason="no_capacity").count() == 1
    assert "; retrying (attempt 2) in " in job.status_reason
    jobs_schedule()  # within the back-off: no new machine, no new attempt
    assert Attempt.objects.filter(job=job).count() == 1
    assert Instance.objects.filter(status=InstanceStatus.PROVISIONING).count() == 0


@pytest.mark.parametrize(
    ("resources", "shortfall"),
    [
        ("{gpu: {name: A10G, count: 2}}", "fake fake-gpu: 2× A10G requested, this machine has A10G"),
        ("{disk: 500GB}", "fake fake-gpu: 500.0 GiB disk requested, 100.0 GiB available"),
        ("{shm_size: 64GB}", "fake fake-gpu: 64.0 GiB shared memory requested, 32.0 GiB memory available"),
        (
            "{gpu: {name: A10G, memory: 40GB}}",
            "fake fake-gpu: 1× A10G with 40.0 GiB each requested, the largest has 24.0 GiB",
        ),
    ],
)
def test_a_request_no_offer_covers_waits_with_the_shortfall_named(
    fake: CloudAccount, team: Workspace, owner: Person, resources: str, shortfall: str
) -> None:
    run = submit(team, owner.user, workflow="train", text=workflows(resources))
    jobs_schedule()
    job = run.jobs.get()
    assert job.status == JobStatus.PENDING
    assert job.status_reason.startswith("no backend can run this job: ")
    assert job.status_reason.startswith(f"no backend can run this job: {shortfall}; fake fake-")
    assert Instance.objects.count() == 0


def test_the_gpu_offer_is_chosen_for_a_gpu_job(fake: CloudAccount, team: Workspace, owner: Person) -> None:
    submit(team, owner.user, workflow="train", text=workflows("{gpu: {name: A10G, memory: 16GB}, disk: 50GB}"))
    instance = _schedule_until_launched()
    assert instance is not None and (instance.instance_type, float(instance.price_per_hour)) == ("fake-gpu", 1.0)


def test_local_shapes_are_offers_and_a_gpu_job_gets_the_gpu_shape(
    team: Workspace, owner: Person, settings: Any
) -> None:
    shapes = [
        {"name": "cpu-box", "cpus": 2, "memory_bytes": 4 * GIB, "disk_bytes": 50 * GIB},
        {"name": "gpu-box", "cpus": 8, "memory_bytes": 32 * GIB, "disk_bytes": 50 * GIB, "gpus": [{"name": "T4"}]},
    ]
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": True, "LOCAL_SHAPES": shapes}
    gpu = submit(team, owner.user, workflow="train", text=workflows("{gpu: {name: T4}}"))
    cpu = submit(team, owner.user, workflow="train", text=workflows("{cpu: 2}"))

    jobs_schedule()  # the launches would run on commit; the rows say what was asked for

    requested = {i.requested_for_id: i.instance_type for i in Instance.objects.all()}
    assert requested == {gpu.jobs.get().pk: "gpu-box", cpu.jobs.get().pk: "cpu-box"}


def test_a_machine_records_its_price_market_and_source_and_is_billed_from_its_first_hello(
    fake: CloudAccount, team: Workspace, owner: Person
) -> None:
    submit(team, owner.user, workflow="train", text=workflows())
    instance = _schedule_until_launched()
    assert instance is not None
    assert (instance.price_per_hour, instance.market, instance.running_at) == (Decimal("0.1"), "on-demand", None)
    assert instance.price_source == "the offer's price"
    _hello(instance)
    instance.refresh_from_db()
    assert instance.running_at is not None and instance.running_at == instance.connected_at
    first = instance.running_at
    _hello(instance)  # a reconnect does not restart billing
    instance.refresh_from_db()
    assert instance.running_at == first

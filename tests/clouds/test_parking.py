"""A launch task parked after killing its worker (backend/core/deliveries.py):
its instance ends as a failed launch and the job moves on to the next offer."""

from __future__ import annotations

from typing import Any

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceReason, InstanceStatus
from backend.clouds.services.provisioning import instance_launch_parked
from backend.core.deliveries import Parked
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.fixtures import Person, submit

GIB = 2**30
OFFERS = [
    {"instance_type": "fake-a", "region": "r1", "price_per_hour": 0.10, "cpus": 2, "memory_bytes": 4 * GIB},
    {"instance_type": "fake-b", "region": "r1", "price_per_hour": 0.20, "cpus": 2, "memory_bytes": 4 * GIB},
]


def test_a_parked_launch_fails_its_instance_and_the_next_offer_is_tried(
    team: Workspace, owner: Person, fake_account: Any
) -> None:
    fake_account(OFFERS)
    job = submit(team, owner.user).jobs.get()
    jobs_schedule()
    first = Instance.objects.get(requested_for=job)
    parked = Parked("backend.clouds.tasks.instance_launch", "t-1", (str(first.pk),), {}, 3, "")

    outcome = instance_launch_parked(parked)

    first.refresh_from_db()
    message = "internal error: task instance_launch [t-1] killed its worker 3 times; it was parked"
    assert outcome == f"instance {first.pk} terminated: {message}"
    assert (first.status, first.termination_reason, first.status_reason) == (
        InstanceStatus.TERMINATING,
        InstanceReason.LAUNCH_FAILED,
        message,
    )
    jobs_schedule()
    second = Instance.objects.filter(requested_for=job).exclude(pk=first.pk).get()
    assert (first.instance_type, second.instance_type) == ("fake-a", "fake-b")
    assert instance_launch_parked(parked) == f"instance {first.pk} had already ended; nothing failed"

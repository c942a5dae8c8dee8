"""The cloud's own view of every live machine, asked for by the reconciler
once a minute and shown beside ours (fake backend, state only)."""

from __future__ import annotations

from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.clouds.models import CloudAccount, Instance
from backend.clouds.services import reconcile as clouds
from backend.clouds.services.instances import Facts, handle_of, instance_connected
from backend.clouds.services.provisioning import instance_launch_run
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.fixtures import Person, submit

GIB = 2**30
WORKFLOWS = "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n"
OFFER = {"instance_type": "fake-a", "region": "r1", "price_per_hour": 0.1, "cpus": 2, "memory_bytes": 4 * GIB}


@pytest.fixture
def fake(fake_account: Any) -> Any:
    return fake_account([OFFER])


def test_the_reconciler_records_what_the_cloud_says_of_each_live_machine(
    fake: CloudAccount, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()
    instance_launch_run(instance_id=str(instance.pk))
    facts = Facts("box", "10.0.0.1", "test", 2, 4 * GIB, 50 * GIB, [])
    instance_connected(instance_id=str(instance.pk), channel_name="c", facts=facts, busy=False)
    monkeypatch.delattr(clouds._cloud_view, "last", raising=False)

    clouds.clouds_reconcile()  # a connected, idle machine: only the cloud view asks about it

    instance.refresh_from_db()
    assert instance.cloud_state in {"pending", "running"} and instance.cloud_checked_at is not None
    from backend.clouds.services.accounts import compute_of

    compute_of(fake).terminate(handle_of(instance))  # gone behind our back
    monkeypatch.delattr(clouds._cloud_view, "last", raising=False)
    Instance.objects.filter(pk=instance.pk).update(cloud_checked_at=None)

    clouds.clouds_reconcile()

    instance.refresh_from_db()
    assert instance.cloud_state in {"stopping", "terminated", "not_found"}
    assert instance.status == "idle", "the cloud's view decides nothing: a silent runner is judged, not this"

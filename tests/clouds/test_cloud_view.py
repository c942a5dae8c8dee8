"""The cloud's own view of every live machine, asked for by the reconciler
once a minute and shown beside ours (fake backend, state only). A machine
the cloud says is gone while a runner still speaks for it is fenced: that
runner holds a stolen token, or the machine went down under it."""

from __future__ import annotations

from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.clouds.models import CloudAccount, Instance
from backend.clouds.services import reconcile as clouds
from backend.clouds.services.instances import Facts, handle_of, instance_connected
from backend.clouds.services.provisioning import instance_launch_run
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.accounttasks import reconcile_with_account_tasks, run_account_tasks
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
    monkeypatch.delattr(clouds._accounts_to_ask, "view", raising=False)

    clouds.clouds_reconcile()  # a connected, idle machine: only the cloud view asks about it
    run_account_tasks()

    instance.refresh_from_db()
    assert instance.cloud_state in {"pending", "running"} and instance.cloud_checked_at is not None
    from backend.clouds.services.accounts import compute_of

    compute_of(fake).terminate(handle_of(instance))  # gone behind our back
    monkeypatch.delattr(clouds._accounts_to_ask, "view", raising=False)
    Instance.objects.filter(pk=instance.pk).update(cloud_checked_at=None)

    clouds.clouds_reconcile()
    run_account_tasks()

    instance.refresh_from_db()
    assert instance.cloud_state in {"terminated", "not_found"}
    assert (instance.status, instance.termination_reason) == ("lost", "machine_gone")
    assert instance.status_reason == f"machine {instance.name} is gone (the backend says {instance.cloud_state})"


@pytest.mark.django_db(transaction=True)
def test_a_machine_the_cloud_reports_terminated_is_fenced_its_socket_closed_its_job_freed_and_its_token_refused(
    fake: CloudAccount, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asgiref.sync import async_to_sync
    from channels.testing import WebsocketCommunicator
    from trainyard_runner import protocol

    from backend.clouds.services.accounts import compute_of
    from backend.clouds.services.instances import instance_runner_token
    from backend.config.asgi import application
    from backend.runs.models import Attempt, AttemptStatus, Job
    from tests.support.attempts import accept

    run = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()
    instance_launch_run(instance_id=str(instance.pk))
    instance.refresh_from_db()
    token = instance_runner_token(instance)
    hello = protocol.Hello(
        version="test", hostname="box", resources=protocol.Resources(cpus=2, memory_bytes=4 * GIB, disk_bytes=50 * GIB)
    )
    job = run.jobs.get()

    def gone_behind_our_back() -> None:
        compute_of(fake).terminate(handle_of(instance))
        monkeypatch.delattr(clouds._accounts_to_ask, "view", raising=False)
        reconcile_with_account_tasks()  # the clouds' pass, its account tasks, then the work's (what beat runs)

    def connect() -> WebsocketCommunicator:
        return WebsocketCommunicator(
            application, "/ws/runner/", headers=[(b"authorization", f"Bearer {token}".encode())]
        )

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        from channels.db import database_sync_to_async

        ws = connect()
        await ws.connect()
        await ws.send_to(text_data=hello.model_dump_json())
        await ws.receive_from(timeout=5)  # welcome
        await ws.receive_from(timeout=5)  # the job
        assert await database_sync_to_async(accept)(job, instance.pk)
        await ws.send_to(text_data=protocol.Heartbeat(state="busy").model_dump_json())
        await database_sync_to_async(gone_behind_our_back)()
        fenced = await ws.receive_output(timeout=5)
        again = connect()
        await again.connect()
        await again.send_to(text_data=hello.model_dump_json())
        refused = await again.receive_output(timeout=5)
        return fenced, refused

    fenced, refused = async_to_sync(scenario)()

    instance.refresh_from_db()
    reason = f"machine {instance.name} is gone (the backend says {instance.cloud_state})"
    assert fenced == {"type": "websocket.close", "code": protocol.CLOSE_FENCED, "reason": reason}
    assert (instance.status, instance.channel_name) == ("lost", "")
    assert refused == {"type": "websocket.close", "code": protocol.CLOSE_UNAUTHORIZED}, "its token opens nothing now"
    attempt = Attempt.objects.get(job=job, number=1)
    assert attempt.status == AttemptStatus.ENDED and attempt.termination_reason == "instance_lost"
    job.refresh_from_db()
    assert job.instance_id != instance.pk
    assert not Job.objects.filter(pk=job.pk).held_by(instance_id=instance.pk, attempt=1).exists()

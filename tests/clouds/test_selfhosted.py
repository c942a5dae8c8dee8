"""Self-hosted machines: registration tokens, registering, scheduling onto a
registered machine, what the reconciler does (and never does) to one,
fencing and revival after lost, revocation, and tenancy."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.utils import timezone
from rest_framework.test import APIClient
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import (
    AccountStatus,
    CloudAccount,
    ControlPlane,
    Instance,
    InstanceEvent,
    InstanceReason,
    InstanceStatus,
    RunnerRegistrationToken,
    WebPulse,
)
from backend.clouds.services.instances import (
    Facts,
    instance_connected,
    instance_for_token,
    instance_mark_lost,
    instance_refusal,
)
from backend.config.asgi import application
from backend.runs.models import Attempt, AttemptStatus, JobStatus
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.runners import runner_connect
from tests.support.accounttasks import reconcile_with_account_tasks
from tests.support.attempts import accept
from tests.support.fixtures import Person, submit
from tests.support.queue import enqueued

GIB = 2**30
BIG = "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n    resources: {cpu: 64}\n"
BIG_FACTS = Facts("gpu-box", "10.0.0.9", "test", 64, 256 * GIB, 500 * GIB, [])
TOKENS = "/api/v1/workspaces/acme/runners/registration-tokens/"


@pytest.fixture(autouse=True)
def no_local_backend(settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False, "HEARTBEAT_TIMEOUT_SECONDS": 5.0}


@pytest.fixture
def hearing(db: None) -> None:
    now = timezone.now()
    WebPulse.objects.create(process="web:1", at=now)
    ControlPlane.objects.create(reconciled_at=now - timedelta(seconds=1), hearing_since=now - timedelta(hours=1))


def _token(owner: Person) -> str:
    answer = owner.client().post(TOKENS, {"note": "lab box"}, format="json")
    assert answer.status_code == 201, answer.content
    return str(answer.json()["token"])


def _register(token: str, name: str = "gpu-box") -> Any:
    return APIClient().post("/api/v1/runner/register/", {"token": token, "name": name}, format="json")


def _registered(owner: Person) -> tuple[Instance, str]:
    answer = _register(_token(owner))
    assert answer.status_code == 201, answer.content
    return Instance.objects.get(pk=answer.json()["runner"]), str(answer.json()["runner_token"])


def _hello(held: list[protocol.HeldJob] | None = None) -> protocol.Hello:
    r = protocol.Resources(cpus=64, memory_bytes=256 * GIB, disk_bytes=500 * GIB)
    return protocol.Hello(version="test", hostname="gpu-box", resources=r, running_jobs=held or [])


# ------------------------------------------------------------ tokens, registering


def test_a_registration_token_is_shown_once_and_listed_without_its_secret(team: Workspace, owner: Person) -> None:
    created = owner.client().post(TOKENS, {"note": "lab box"}, format="json").json()

    listed = owner.client().get(TOKENS)

    assert created["token"].startswith("tyreg_") and created["state"] == "unused"
    assert listed.status_code == 200 and created["token"] not in listed.content.decode()
    assert [t["id"] for t in listed.json()] == [created["id"]] and "token" not in listed.json()[0]
    assert created["token"] not in json.dumps(list(RunnerRegistrationToken.objects.values("token_hash", "prefix")))


def test_registering_makes_one_self_hosted_row_under_a_self_hosted_account(team: Workspace, owner: Person) -> None:
    answer = _register(_token(owner))

    body = answer.json()
    instance = Instance.objects.get(pk=body["runner"])
    assert answer.status_code == 201 and body["name"] == "gpu-box" and body["workspace"] == "acme"
    assert (instance.backend, instance.status, instance.workspace_id) == ("self-hosted", "provisioning", team.pk)
    assert instance.account is not None and (instance.account.kind, instance.account.name) == (
        "self-hosted",
        "self-hosted",
    )
    assert instance_for_token(token=body["runner_token"]) == instance
    assert body["runner_token"] not in json.dumps(list(Instance.objects.values("token_hash", "name")))


def test_a_used_or_revoked_registration_token_cannot_register(team: Workspace, owner: Person) -> None:
    used = _token(owner)
    assert _register(used).status_code == 201
    revoked = _token(owner)
    revoked_id = RunnerRegistrationToken.objects.get(used_at=None).pk
    assert owner.client().delete(f"{TOKENS}{revoked_id}/").status_code == 204

    again, refused = _register(used, "second"), _register(revoked, "third")

    assert again.status_code == 401 and again.json()["message"].startswith("This registration token is used")
    assert refused.status_code == 401 and refused.json()["message"].startswith("This registration token is revoked")
    assert _register("tyreg_nonsense").json()["message"].startswith("This registration token is unknown")
    assert Instance.objects.count() == 1


def test_only_admins_make_tokens_and_another_workspace_sees_nothing(
    team: Workspace, owner: Person, member: Person, outsider: Person
) -> None:
    instance, _ = _registered(owner)
    token_id = RunnerRegistrationToken.objects.get().pk

    assert member.client().post(TOKENS, {}, format="json").status_code == 403
    assert outsider.client().post(TOKENS, {}, format="json").status_code == 404
    assert outsider.client().get(TOKENS).status_code == 404
    assert outsider.client().get("/api/v1/workspaces/acme/runners/").status_code == 404
    assert outsider.client().delete(f"{TOKENS}{token_id}/").status_code == 404
    assert outsider.client().post(f"/api/v1/workspaces/acme/runners/{instance.pk}/revoke/").status_code == 404
    # Their own workspace does not know A's runner either.
    theirs = outsider.client().get("/api/v1/me/").json()["default_workspace"]
    assert outsider.client().post(f"/api/v1/workspaces/{theirs}/runners/{instance.pk}/revoke/").status_code == 404
    assert outsider.client().get(f"/api/v1/workspaces/{theirs}/runners/").json() == []
    assert member.client().get("/api/v1/workspaces/acme/runners/").json()[0]["name"] == "gpu-box"
    assert RunnerRegistrationToken.objects.count() == 1 and Instance.objects.get().status == "provisioning"


# ------------------------------------------------------------ scheduling, reconciling


def test_a_job_that_fits_only_the_registered_machine_goes_to_it(team: Workspace, owner: Person) -> None:
    instance, _ = _registered(owner)
    run = submit(team, owner.user, workflow="train", text=BIG)
    jobs_schedule()
    assert run.jobs.get().status == JobStatus.PENDING  # not connected yet: nothing to run on

    instance_connected(instance_id=str(instance.pk), channel_name="c", facts=BIG_FACTS, busy=False)
    jobs_schedule()

    job = run.jobs.get()
    assert (job.status, job.instance_id) == (JobStatus.ASSIGNED, instance.pk)
    assert Instance.objects.count() == 1  # nothing was requested from a backend


def test_the_reconciler_never_launches_times_out_or_retires_a_registered_machine(
    hearing: None, team: Workspace, owner: Person
) -> None:
    waiting, _ = _registered(owner)
    idle, _ = _registered(owner)
    Instance.objects.filter(pk=waiting.pk).update(created_at=timezone.now() - timedelta(days=2))
    instance_connected(instance_id=str(idle.pk), channel_name="c", facts=BIG_FACTS, busy=False)
    Instance.objects.filter(pk=idle.pk).update(idle_since=timezone.now() - timedelta(days=2))

    reconcile_with_account_tasks()

    assert Instance.objects.get(pk=waiting.pk).status == InstanceStatus.PROVISIONING
    assert Instance.objects.get(pk=idle.pk).status == InstanceStatus.IDLE
    assert CloudAccount.objects.get(kind="self-hosted").status == AccountStatus.ACTIVE


def test_a_silent_machine_is_fenced_after_the_grace_and_a_later_hello_brings_the_same_row_back(
    hearing: None, team: Workspace, owner: Person, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "UNREACHABLE_GRACE_SECONDS": 30.0}
    instance, token = _registered(owner)
    instance_connected(instance_id=str(instance.pk), channel_name="c", facts=BIG_FACTS, busy=False)
    run = submit(team, owner.user, workflow="train", text=BIG)
    jobs_schedule()
    job = run.jobs.get()
    assert accept(job, instance.pk)
    Instance.objects.filter(pk=instance.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=60))
    reconcile_with_account_tasks()  # silent → unreachable
    Instance.objects.filter(pk=instance.pk).update(unreachable_since=timezone.now() - timedelta(seconds=60))
    with django_capture_on_commit_callbacks() as callbacks:
        reconcile_with_account_tasks()  # unreachable past the grace → lost (fenced), not terminated
    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == (InstanceStatus.LOST, InstanceReason.UNREACHABLE_GRACE)
    assert "backend.clouds.tasks.instance_terminate" not in enqueued(callbacks)  # no terminate task
    assert instance_for_token(token=token) == instance  # the identity outlives the fencing

    held = protocol.HeldJob(job=str(job.pk), attempt=1, lease=Attempt.objects.get(job=job).lease, confirmed=True)
    connected = runner_connect(
        instance_id=str(instance.pk), hello=_hello([held]), channel_name="c2", heartbeat_seconds=1
    )

    instance.refresh_from_db()
    attempt = Attempt.objects.get(job=job, number=1)
    assert connected.welcome is not None and connected.welcome.refused == [str(job.pk)]
    assert (attempt.status, attempt.termination_reason) == (AttemptStatus.ENDED, "unreachable")
    assert (instance.status, instance.termination_reason, instance.terminated_at) == (InstanceStatus.IDLE, "", None)
    assert Instance.objects.filter(backend="self-hosted").count() == 1
    assert (
        InstanceEvent.objects.filter(instance=instance, to_status="idle")
        .order_by("created_at")
        .last()
        .message.endswith("after it was lost")
    )


def test_a_lost_self_hosted_machine_is_not_sent_to_a_backend_terminate(
    team: Workspace, owner: Person, django_capture_on_commit_callbacks: Any
) -> None:
    instance, _ = _registered(owner)
    Instance.objects.filter(pk=instance.pk).update(channel_name="specific.abc")

    with django_capture_on_commit_callbacks() as callbacks:
        assert instance_mark_lost(instance_id=str(instance.pk), reason=InstanceReason.MACHINE_GONE, message="gone")

    # The socket is dropped (so the runner reconnects and its attempts are fenced); no terminate task.
    assert [c.__code__.co_names for c in callbacks] == [("send_to_channel",)]


# ------------------------------------------------------------ revoking


@pytest.mark.django_db(transaction=True)
def test_a_revoked_runner_is_refused_at_connect_with_the_reason(team: Workspace, owner: Person) -> None:
    instance, token = _registered(owner)

    answer = owner.client().post(f"/api/v1/workspaces/acme/runners/{instance.pk}/revoke/")

    instance.refresh_from_db()
    assert answer.status_code == 204
    assert (instance.status, instance.termination_reason) == (InstanceStatus.TERMINATED, InstanceReason.REVOKED)
    assert instance_for_token(token=token) is None
    assert "was revoked" in instance_refusal(token=token)
    assert _close_of(token) == {
        "type": "websocket.close",
        "code": 4401,
        "reason": "runner gpu-box was revoked; register the machine again (trainyard-runner register)",
    }
    listed = owner.client().get("/api/v1/workspaces/acme/runners/").json()
    assert listed[0]["revoked"] is True and listed[0]["status"] == "terminated"


def _close_of(token: str) -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        ws = WebsocketCommunicator(application, "/ws/runner/", headers=[(b"authorization", f"Bearer {token}".encode())])
        await ws.connect()
        closed: dict[str, Any] = await ws.receive_output(timeout=5)
        await ws.wait()
        return closed

    return async_to_sync(scenario)()


def test_the_self_hosted_backend_offers_nothing_launches_nothing_and_presumes_machines_are_there() -> None:
    from backend.clouds.backends.base import AccountConfig, CloudState, Handle, LaunchSpec, Offer, Requirements
    from backend.clouds.backends.errors import InvalidConfig
    from backend.clouds.backends.registry import compute_for

    compute = compute_for(AccountConfig("a", "w", "self-hosted", "ty-test", {}))
    offer = Offer(backend="self-hosted", instance_type="x", region="r", cpus=1, memory_bytes=0, disk_bytes=0)

    assert list(compute.offers(Requirements())) == [] and list(compute.list_managed()) == []
    with pytest.raises(InvalidConfig, match="self-hosted machines are registered, not launched"):
        compute.launch(offer, LaunchSpec("k", "n", "t", "http://x"))
    assert compute.describe([Handle("k1", ""), Handle("k2", "")]) == {
        "k1": CloudState.RUNNING,
        "k2": CloudState.RUNNING,
    }
    assert compute.terminate(Handle("k1", "")) is None

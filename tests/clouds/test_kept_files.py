"""A job failed because its artifacts could not be uploaded, its files kept
on its cloud machine (runner/trainyard_runner/kept.py), in process: real
Postgres, the real runner consumer over a WebsocketCommunicator, the
runner's REST routes, local storage. The idle machine is not retired while
its runner says it keeps files; that runner, and only it, uploads the
kept attempt's declared artifacts once storage answers, the job's reason
then says so (no "kept until"), and the machine is retired. Files whose time
is up no longer hold the machine, and the reason says they were removed.
The runner's side (heartbeats, retries, removal) is tests/runner/test_upload_outage.py."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone
from rest_framework.test import APIClient
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceReason, InstanceStatus
from backend.clouds.services.instances import instance_disconnected
from backend.clouds.services.provisioning import instance_terminate_run
from backend.core.tokens import hash_token
from backend.runs.models import Job, JobStatus, Run
from backend.runs.services.reconcile import reconcile
from tests.clouds.test_placement import _running, _schedule, offer, workflow
from tests.clouds.test_spot_interruption import HELLO, _connect
from tests.support.accounttasks import run_account_tasks
from tests.support.attempts import current_attempt, job_credential
from tests.support.fixtures import Person, submit

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = b"trained weights " * 1000
KEPT = "the job's files are kept on box in /var/lib/trainyard/kept/{job}.1/work until 2026-12-06 10:00 UTC"


def _runner_api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _failed_with_kept_files(
    fake_account: Any, team: Workspace, owner: Person, *, kept_for: float
) -> tuple[Job, Instance, list[dict[str, Any]]]:
    """A job on a fake cloud machine whose runner (token ``runner-secret``)
    reports it failed, its upload refused, its files kept ``kept_for``
    seconds, then heartbeats idle saying so; returns the answers it got."""
    fake_account([offer("a", 0.1)])
    text = workflow(artifacts="[./model]", idle_duration="30s")
    job = submit(team, owner.user, workflow="train", text=text).jobs.get()
    instance = _schedule(passes=1)
    assert instance is not None
    Instance.objects.filter(pk=instance.pk).update(token_hash=hash_token("runner-secret"))
    job = _running(job, instance)
    held = protocol.HeldJob(job=str(job.pk), attempt=1, lease=current_attempt(job).lease, confirmed=True)
    instance_disconnected(instance_id=str(instance.pk), channel_name="c")
    until = time.time() + kept_for
    reason = "artifact upload failed: PUT http://storage/…: HTTP 503; " + KEPT.format(job=job.pk)

    async def scenario() -> list[dict[str, Any]]:
        ws = _connect("runner-secret")
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_copy(update={"running_jobs": [held]}).model_dump_json())
        answers = [json.loads(await ws.receive_from(timeout=5))]
        final = protocol.JobState(job=str(job.pk), attempt=1, state="failed", reason=reason, kept_until=until)
        await ws.send_to(text_data=final.model_dump_json())
        await ws.send_to(text_data=protocol.Heartbeat(state="idle", kept_until=until).model_dump_json())
        while not await ws.receive_nothing(timeout=1.0):
            answers.append(json.loads(await ws.receive_from(timeout=1)))
        await ws.disconnect()
        return answers

    answers = async_to_sync(scenario)()
    job.refresh_from_db()
    instance.refresh_from_db()
    return job, instance, answers


def _idle_for_long(instance: Instance) -> None:
    """Idle past its job's idle_duration (30s), heard just now."""
    Instance.objects.filter(pk=instance.pk).update(
        idle_since=timezone.now() - timedelta(seconds=600), last_heartbeat_at=timezone.now()
    )


def _reconcile() -> None:
    reconcile()
    run_account_tasks()


def _upload(client: APIClient, job: Job, attempt: int, path: str = "./model") -> Any:
    """The runner's upload of one artifact: begin, PUT the file to its signed URL, complete."""
    manifest = [{"path": "w.bin", "size": len(MODEL), "sha256": hashlib.sha256(MODEL).hexdigest()}]
    begun = client.post(
        f"/api/v1/runner/jobs/{job.pk}/artifacts/?attempt={attempt}", {"path": path, "files": manifest}, format="json"
    )
    if begun.status_code != 201:
        return begun
    for upload in begun.json()["uploads"]:
        put = APIClient().put(urlsplit(upload["url"]).path, MODEL, content_type="application/octet-stream")
        assert put.status_code in (200, 201), put.content
    return client.post(f"/api/v1/runner/jobs/{job.pk}/artifacts/{begun.json()['id']}/complete/?attempt={attempt}")


def test_a_kept_model_survives_idle_retirement_and_is_uploaded_when_storage_returns(
    fake_account: Any, script: Path, team: Workspace, owner: Person, settings: Any, tmp_path: Path
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path / "storage"}
    job, instance, answers = _failed_with_kept_files(fake_account, team, owner, kept_for=3600)
    assert [a["type"] for a in answers] == ["welcome"], "the failed final state is not refused"
    assert job.status == JobStatus.FAILED
    assert "kept on box" in job.status_reason and "until" in job.status_reason
    assert instance.status == InstanceStatus.IDLE and instance.kept_until is not None

    # Idle far past its idle_duration: not retired while its runner keeps the model.
    _idle_for_long(instance)
    _reconcile()
    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.IDLE

    # Only the runner that keeps the files, with that attempt's job token, only that attempt, only declared artifacts.
    runner = _runner_api(job_credential("runner-secret", job, 1))
    assert _upload(_runner_api("stolen-or-other"), job, 1).status_code == 401
    assert _upload(_runner_api("runner-secret"), job, 1).status_code == 401, "the runner's token alone"
    assert _upload(runner, job, 2).status_code == 404
    undeclared = _upload(runner, job, 1, path="./elsewhere")
    assert undeclared.status_code == 400
    assert undeclared.json()["message"] == "Only the job's declared artifacts are uploaded from kept files."
    checkpoint = runner.post(f"/api/v1/runner/jobs/{job.pk}/checkpoints/?attempt=1", {"path": "./c", "files": []})
    assert checkpoint.status_code == 404, "a kept attempt uploads its artifacts, nothing else"

    # Storage answers again: the runner uploads the kept model and says so.
    done = _upload(runner, job, 1)
    assert done.status_code == 200, done.content
    kept = f"/api/v1/runner/jobs/{job.pk}/kept/?attempt=1"
    for bad in ({"outcome": "gone"}, {"outcome": ["uploaded"]}, {}):  # "gone" is the server's word only
        refused = runner.post(kept, bad, format="json")
        assert refused.status_code == 400 and "outcome" in refused.json()["extra"]["fields"], refused.content
    assert runner.post(kept, {"outcome": "uploaded"}, format="json").status_code == 204

    listed = owner.client().get(f"/api/v1/workspaces/{team.slug}/runs/{job.run.name}/artifacts/")
    assert listed.status_code == 200, listed.content
    artifact = next(a for a in _items(listed.json()) if a["path"] == "./model")
    redirect = owner.client().get(f"/api/v1/workspaces/{team.slug}/artifacts/{artifact['id']}/files/w.bin")
    download = owner.client().get(urlsplit(redirect["Location"]).path)
    assert async_to_sync(_collect)(download.streaming_content) == MODEL

    job.refresh_from_db()
    assert "until" not in job.status_reason and "kept on box in" not in job.status_reason
    assert "the job's files kept on box were uploaded as its artifacts at" in job.status_reason
    assert job.status_reason.startswith("artifact upload failed: ")
    assert Run.objects.get(pk=job.run_id).status_reason == job.status_reason  # what `trainyard ps` shows
    assert _upload(runner, job, 1).status_code == 404, "once uploaded, the attempt uploads no more"

    # Its next heartbeat says nothing is kept: retired at the next pass.
    instance_heartbeat_idle(instance, kept_until=None)
    _reconcile()
    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == (InstanceStatus.TERMINATING, InstanceReason.IDLE_RETIRED)
    instance_terminate_run(instance_id=str(instance.pk))


def test_kept_files_whose_time_is_up_no_longer_hold_the_machine_and_the_reason_says_they_were_removed(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    job, instance, _ = _failed_with_kept_files(fake_account, team, owner, kept_for=2)
    _idle_for_long(instance)
    _reconcile()
    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.IDLE, "within their time"

    time.sleep(2.5)
    runner = _runner_api(job_credential("runner-secret", job, 1))
    assert _upload(runner, job, 1).status_code == 404, "past their time, no upload is taken"
    _reconcile()
    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == (InstanceStatus.TERMINATING, InstanceReason.IDLE_RETIRED)
    # Its runner removed them (the time-up sweep) and says so, however late.
    assert runner.post(f"/api/v1/runner/jobs/{job.pk}/kept/?attempt=1", {"outcome": "removed"}).status_code == 204
    job.refresh_from_db()
    assert "until" not in job.status_reason
    assert "the job's files kept on box were removed at" in job.status_reason
    instance_terminate_run(instance_id=str(instance.pk))


def test_files_kept_on_a_machine_that_ended_are_said_lost_with_it(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    job, instance, _ = _failed_with_kept_files(fake_account, team, owner, kept_for=3600)
    instance_terminate_run(instance_id=str(instance.pk))
    Instance.objects.filter(pk=instance.pk).update(status=InstanceStatus.TERMINATED)

    _reconcile()

    job.refresh_from_db()
    assert job.kept_until is None
    assert "until" not in job.status_reason
    assert "the job's files kept on box were lost with the machine at" in job.status_reason


def test_a_heartbeats_kept_until_holds_the_machine_at_most_a_week(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    _, instance, _ = _failed_with_kept_files(fake_account, team, owner, kept_for=3600)
    instance_heartbeat_idle(instance, kept_until=time.time() + 365 * 24 * 3600)
    instance.refresh_from_db()
    assert instance.kept_until is not None
    assert instance.kept_until <= timezone.now() + timedelta(seconds=protocol.MAX_KEPT_SECONDS)
    instance_terminate_run(instance_id=str(instance.pk))


def instance_heartbeat_idle(instance: Instance, *, kept_until: float | None) -> None:
    """A heartbeat over the runner's socket, as its runner sends it."""

    async def beat() -> None:
        ws = _connect("runner-secret")
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_dump_json())
        await ws.receive_from(timeout=5)
        await ws.send_to(text_data=protocol.Heartbeat(state="idle", kept_until=kept_until).model_dump_json())
        await ws.receive_nothing(timeout=1.0)
        await ws.disconnect()

    async_to_sync(beat)()


def _items(body: Any) -> list[dict[str, Any]]:
    return body["results"] if isinstance(body, dict) else body


async def _collect(body: Any) -> bytes:
    return b"".join([part async for part in body])

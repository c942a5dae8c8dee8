"""The values a submitter sends (``-e`` and the bare env names' values from
their shell) are treated as secrets: encrypted at rest, delivered over the
runner's authenticated fetch, masked in logs, and never in Redis traffic;
and no event written into the channel layer by anyone but the server
reaches a runner."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from trainyard_spec import Source

from backend.accounts.models import Workspace
from backend.accounts.services import hash_token
from backend.clouds.models import Instance, InstanceStatus
from backend.config.asgi import application
from backend.runs.lifecycle.privateenv import private_inputs_of
from backend.runs.lifecycle.redaction import job_reason_clean
from backend.runs.models import Job, Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.logs import logs_store
from backend.runs.services.runs import CodeInput, PlanInputs, run_create, run_rerun
from tests.support.attempts import accept, assign_frame, runner_get
from tests.support.fixtures import Person
from tests.support.runners import runner_instance

INHERITED = "hf_from-the-shell-0123456789"
OVERRIDE = "override-value-9876543210"
WORKFLOWS = """\
workflows:
  - name: hello
    provider: bash
    env:
      - HF_TOKEN
      - PLAIN=visible
    artifacts: [./out]
    commands: [echo hello]
"""
RUNNER = "runner-token-of-l"


def _submit(team: Workspace, owner: Person, override: str = OVERRIDE) -> Run:
    return run_create(
        workspace=team,
        user=owner.user,
        workflow="hello",
        inputs=PlanInputs(
            files=(Source(".trainyard/workflows.yaml", WORKFLOWS),),
            env={"WANDB_KEY": override},
            inherited_env={"HF_TOKEN": INHERITED},
        ),
        code=CodeInput(kind="git", repo_url="https://example.com/acme/models.git", commit="a" * 40),
    )


class _Monitor:
    """Every command Redis executes, as MONITOR reports it, while open."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._client = redis.Redis.from_url(settings.REDIS_URL)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def _listen(self) -> None:
        with self._client.monitor() as monitor:
            self._ready.set()
            for command in monitor.listen():
                self.seen.append(str(command.get("command", "")))
                if self._stop.is_set():
                    return

    def __enter__(self) -> _Monitor:
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        redis.Redis.from_url(settings.REDIS_URL).ping()  # wakes the listener
        self._thread.join(5)

    def text(self) -> str:
        return "\n".join(self.seen)


def test_inherited_and_override_values_are_encrypted_at_rest_fetched_by_the_runner_masked_and_never_in_redis(
    team: Workspace, owner: Person
) -> None:
    with _Monitor() as watched:
        run = _submit(team, owner)
        instance = runner_instance(team, "l", RUNNER, channel_name="c-l")
        jobs_schedule()  # the assignment goes through the channel layer (Redis) to c-l
        job = run.jobs.get()
        accept(job, instance.pk)
        frame = assign_frame(job)
        fetched = runner_get(job, RUNNER, "secrets")
        stored = logs_store(
            job_id=str(job.pk),
            instance_id=str(instance.pk),
            attempt=1,
            first_seq=1,
            lines=[(1.0, "o", f"token={INHERITED}"), (2.0, "e", f"key {OVERRIDE}")],
        )
        reason = job_reason_clean(job_id=job.pk, reason=f"failed with {INHERITED}")
    traffic = watched.text()

    row = Run.objects.filter(pk=run.pk).values("env_overrides", "inherited_env", "private_inputs").get()
    spec = json.dumps(Job.objects.get(pk=job.pk).spec)
    assert str(job.pk) in traffic, "the monitor saw the assignment go through Redis"
    assert INHERITED not in traffic and OVERRIDE not in traffic
    assert (row["env_overrides"], row["inherited_env"]) == ({}, {})
    assert INHERITED.encode() not in bytes(row["private_inputs"]) and OVERRIDE.encode() not in bytes(
        row["private_inputs"]
    )
    assert INHERITED not in spec and OVERRIDE not in spec
    assert frame.secrets is True and frame.env.get("PLAIN") == "visible"
    assert "HF_TOKEN" not in frame.env and "WANDB_KEY" not in frame.env
    assert INHERITED not in frame.model_dump_json() and OVERRIDE not in frame.model_dump_json()
    assert fetched.status_code == 200
    assert fetched.json() == {"env": {"HF_TOKEN": INHERITED, "WANDB_KEY": OVERRIDE}, "credential": None}
    assert [line[2] for line in stored.new_lines] == ["token=*****", "key *****"]
    assert reason == "failed with *****"


def test_a_rerun_sends_the_same_values_and_a_changed_value_misses_the_cache(team: Workspace, owner: Person) -> None:
    first = _submit(team, owner)
    again = run_rerun(run=first, user=owner.user)
    changed = _submit(team, owner, override="another-value-0000")

    specs = [r.jobs.get().spec for r in (first, again, changed)]

    assert specs[0]["private_env"] == specs[1]["private_env"] != specs[2]["private_env"]
    assert set(specs[0]["private_env"]) == {"HF_TOKEN", "WANDB_KEY"}
    assert private_inputs_of(again).jobs == {"hello": {"HF_TOKEN": INHERITED, "WANDB_KEY": OVERRIDE}}


@pytest.mark.django_db(transaction=True)
def test_an_event_written_into_the_channel_layer_by_anyone_but_the_server_never_reaches_the_runner(
    team: Workspace,
) -> None:
    Instance.objects.create(
        workspace=team, backend="local", name="local-x", token_hash=hash_token("runner-secret"),
        status=InstanceStatus.PROVISIONING,
    )  # fmt: skip

    async def scenario() -> dict[str, Any]:
        from trainyard_runner import protocol

        ws = WebsocketCommunicator(application, "/ws/runner/", headers=[(b"authorization", b"Bearer runner-secret")])
        await ws.connect()
        greeting = protocol.Hello(
            version="test", hostname="box", resources=protocol.Resources(cpus=2, memory_bytes=2**31, disk_bytes=2**33)
        )
        await ws.send_to(text_data=greeting.model_dump_json())
        await ws.receive_from(timeout=5)  # welcome
        channel = await _channel_of("local-x")
        layer = get_channel_layer()
        injected = protocol.CancelJob(job="00000000-0000-0000-0000-000000000001", attempt=1, reason="injected")
        await layer.send(channel, {"type": "runner.frame", "frame": injected.model_dump_json()})
        await layer.send(channel, {"type": "runner.frame", "frame": injected.model_dump_json(), "sig": "0" * 64})
        await layer.send(channel, {"type": "runner.fenced", "reason": "injected"})
        forwarded = await ws.receive_nothing(timeout=1)
        from backend.core.channels import signed

        real = protocol.CancelJob(job="00000000-0000-0000-0000-000000000002", attempt=1, reason="from the server")
        await layer.send(channel, signed({"type": "runner.frame", "frame": real.model_dump_json()}))
        delivered = json.loads(await ws.receive_from(timeout=5))
        await ws.disconnect()
        return {"nothing": forwarded, "delivered": delivered}

    result = async_to_sync(scenario)()

    assert result["nothing"] is True
    assert (result["delivered"]["type"], result["delivered"]["reason"]) == ("cancel_job", "from the server")


async def _channel_of(name: str) -> str:
    from channels.db import database_sync_to_async

    @database_sync_to_async
    def read() -> str:
        return str(Instance.objects.get(name=name).channel_name)

    return await read()

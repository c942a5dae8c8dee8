"""A session into a job on a spot machine across the job's interruption:
moto's server plays EC2, tests/support/ec2boot.py boots each machine and
serves its instance metadata, where the test puts the notice.

The open session ends at the notice with a message that says what happened
and what to do (close code 4409); the job resumes on a second machine, and a
new session reaches it there. Nothing of ours is left running."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.e2e.conftest import User
from tests.e2e.test_aws import _instances
from tests.e2e.test_relay_aws import IDLE_SECONDS, _echo, _wait, run_echo_on_aws
from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

BUCKET = "ty-e2e-relay-spot"


@pytest.fixture
def sora(stack: Stack) -> User:
    """A workspace of its own: its AWS account touches no other test's runs."""
    return User("sora", stack.issue_token("sora"), stack)


def test_a_spot_notice_ends_the_session_saying_so_and_a_new_session_reaches_the_resumed_job(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, sora: User, repo: Path
) -> None:
    name = run_echo_on_aws(sora, repo, aws, bucket=BUCKET)
    port = _wait("the echo server on the first machine", lambda: _listening(sora, name, attempt=1), 300)
    first = _job(sora, name)["instance"]
    [machine] = [i for i in _instances(sora) if i["name"] == first]

    grant = _grant(sora, name, port)
    notice = lambda: ec2_boot.notice(machine["backend_id"], "terminate", time.time() + 25)  # noqa: E731
    ended = asyncio.run(_held_until_the_end(stack, grant, notice))

    code, reason, said = ended
    assert code == 4409, ended
    assert "reclaimed (spot)" in reason and "start a new session" in reason, ended
    assert said == reason  # the end message came before the close, with the same words

    port = _wait("the echo server on the second machine", lambda: _listening(sora, name, attempt=2), 360)
    assert _job(sora, name)["instance"] != first
    again = _grant(sora, name, port)
    sent = os.urandom(256 << 10)
    assert asyncio.run(_echo(f"{stack.ws_url}/ws/v1/relay/{again['id']}/", again["token"], sent)) == sent

    assert sora.cli(repo, "stop", name).returncode == 0
    _wait("every machine to be terminated", lambda: not aws.our_instances(), IDLE_SECONDS + 180)
    assert sora.cli(repo, "backend", "rm", "aws").returncode == 0


async def _held_until_the_end(stack: Stack, grant: dict[str, Any], notice: Any) -> tuple[int, str, str]:
    """An open session (bytes echoed once), the notice, then what the client
    is told: (close code, close reason, the end message's reason)."""
    url = f"{stack.ws_url}/ws/v1/relay/{grant['id']}/"
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {grant['token']}"}) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), 60)) == {"type": "ready"}
        await ws.send(b"ping")
        assert await asyncio.wait_for(ws.recv(), 30) == b"ping"
        notice()
        said = ""
        try:
            while True:
                frame = await asyncio.wait_for(ws.recv(), 60)
                if isinstance(frame, str) and json.loads(frame).get("type") == "end":
                    said = json.loads(frame)["reason"]
        except websockets.ConnectionClosed as closed:
            assert closed.rcvd is not None, "the server closed the session with a code and a reason"
            return closed.rcvd.code, closed.rcvd.reason, said
    raise AssertionError("the session did not end")


def _grant(user: User, run: str, port: int) -> dict[str, Any]:
    granted = user.api("POST", f"/api/v1/workspaces/{user.workspace}/runs/{run}/sessions/", json={
        "kind": "port", "port": port
    })  # fmt: skip
    assert granted.status_code == 201, granted.text
    answer: dict[str, Any] = granted.json()
    return answer


def _job(user: User, run: str) -> dict[str, Any]:
    job: dict[str, Any] = user.run(run)["jobs"][0]
    return job


def _listening(user: User, run: str, *, attempt: int) -> int | None:
    """The job's port once attempt ``attempt`` runs and its echo server said so."""
    job = _job(user, run)
    if job["status"] != "running" or job["attempt"] != attempt or not job.get("ports"):
        return None
    logs = user.api("GET", f"/api/v1/workspaces/{user.workspace}/jobs/{job['id']}/logs/").json()
    said = sum("echo listening" in line["text"] for line in logs.get("lines", []))
    return int(job["ports"][0]) if said >= attempt else None

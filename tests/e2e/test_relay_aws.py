"""A session into a job on a machine in the user's AWS account (moto plays
EC2, tests/support/ec2boot.py its boot): the machine's security group admits
nothing inbound, and the session still reaches the job's port, because the
runner dials the relay out to the server."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import boto3
import pytest
import websockets

from tests.e2e.conftest import User, commit_all, connect_aws, run_name_of
from tests.e2e.test_relay_scale_out import ECHO
from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack
from tests.support.waiting import wait_for as _wait

pytestmark = pytest.mark.slow

BUCKET = "ty-e2e-relay"
IDLE_SECONDS = 10
WORKFLOW = f"""
  - name: echo-aws
    provider: bash
    ports: 1
    backends: [aws]
    spot_policy: spot
    idle_duration: {IDLE_SECONDS}s
    commands:
      - python echo.py
"""


@pytest.fixture
def rhea(stack: Stack) -> User:
    """A workspace of its own: its AWS account touches no other test's runs."""
    return User("rhea", stack.issue_token("rhea"), stack)


def test_a_port_session_reaches_a_job_on_an_aws_machine_that_admits_nothing_inbound(
    stack: Stack, aws: MotoServer, ec2_boot: Ec2Boot, rhea: User, repo: Path
) -> None:
    name = run_echo_on_aws(rhea, repo, aws, bucket=BUCKET)
    port = _wait("the echo server on the machine", lambda: _listening(rhea, name), 300)
    machine = aws.our_instances(states=("running",))[0]
    assert machine["InstanceId"] in ec2_boot.booted

    granted = rhea.api("POST", f"/api/v1/workspaces/{rhea.workspace}/runs/{name}/sessions/", json={
        "kind": "port", "port": port
    })  # fmt: skip
    assert granted.status_code == 201, granted.text
    grant = granted.json()
    sent = os.urandom(1 << 20)
    echoed = asyncio.run(_echo(f"{stack.ws_url}/ws/v1/relay/{grant['id']}/", grant["token"], sent))

    assert echoed == sent
    groups = boto3.client("ec2", region_name="us-east-1").describe_security_groups(
        GroupIds=[g["GroupId"] for g in machine["SecurityGroups"]]
    )["SecurityGroups"]
    assert groups and all(g["IpPermissions"] == [] for g in groups), groups
    assert rhea.cli(repo, "stop", name).returncode == 0
    _wait("the idle machine to be terminated", lambda: not aws.our_instances(), IDLE_SECONDS + 120)
    assert rhea.cli(repo, "backend", "rm", "aws").returncode == 0


def run_echo_on_aws(user: User, repo: Path, aws: MotoServer, *, bucket: str) -> str:
    """The user's AWS account connected, and a run of a TCP echo server on a
    spot machine there (``WORKFLOW``) submitted: its name."""
    connect_aws(user, repo, aws, bucket=bucket)
    (repo / "echo.py").write_text(ECHO)
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + WORKFLOW)
    commit_all(repo, "an echo server on AWS")
    return run_name_of(user.cli(repo, "run", "echo-aws", "-d"))


async def _echo(url: str, token: str, data: bytes) -> bytes:
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), 60)) == {"type": "ready"}
        frames = [data[i : i + (128 << 10)] for i in range(0, len(data), 128 << 10)]  # a frame is at most 256 KiB
        sending = asyncio.ensure_future(_send_all(ws, frames))
        got = bytearray()
        while len(got) < len(data):
            frame = await asyncio.wait_for(ws.recv(), 30)
            assert isinstance(frame, bytes), frame
            got += frame
        await sending
    return bytes(got)


async def _send_all(ws: Any, frames: list[bytes]) -> None:
    for frame in frames:
        await ws.send(frame)


def _listening(user: User, run: str) -> int | None:
    job = user.run(run)["jobs"][0]
    if job["status"] != "running" or not job.get("ports"):
        return None
    logs = user.api("GET", f"/api/v1/workspaces/{user.workspace}/jobs/{job['id']}/logs/").json()
    said = any("echo listening" in line["text"] for line in logs.get("lines", []))
    return int(job["ports"][0]) if said else None

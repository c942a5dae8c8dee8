"""The runner on a cloud machine: the token it gets for the bootstrap one is
saved and wins after a restart; cut off while idle it powers off; at its
maximum lifetime it stops the job, reports it and powers off; its hello says
where it runs (IMDSv2). Real runner processes against a fake server."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from trainyard_runner import machine
from trainyard_runner.protocol import CloudIdentity
from websockets.asyncio.server import ServerConnection, serve

from tests.runner.test_agent import TOKEN, FakeServer, assign, start_runner, stop
from tests.support import iid

# What EC2's metadata serves under /latest/dynamic/instance-identity/ (rsa2048: a multi-line base64 PKCS#7).
DOCUMENT, SIGNATURE = iid.signed(instance_id="i-0123456789abcdef0", instance_type="g5.xlarge", zone="us-east-1a")

OWN = "own-token-after-the-exchange"


class ExchangingServer(FakeServer):
    """Like the server for a machine that boots from an image: the bootstrap
    token (TOKEN) works once, and its Welcome carries the runner's own token;
    after that only the own token is accepted."""

    def __init__(self) -> None:
        super().__init__()
        self.spent = False
        self.tokens: list[str] = []

    async def handler(self, ws: ServerConnection) -> None:
        token = ws.request.headers.get("Authorization", "").removeprefix("Bearer ")  # type: ignore[union-attr]
        self.tokens.append(token)
        if token == TOKEN and not self.spent:
            self.spent = True
            self.welcome_extra = {"token": OWN}
        elif token == OWN:
            self.welcome_extra = {}
        else:
            await ws.close(4401, "bootstrap token already used")
            return
        self.connections += 1
        self.hellos.append(json.loads(await ws.recv()))
        welcome = {"type": "welcome", "instance": "i-1", "heartbeat_seconds": 0.5, **self.welcome_extra}
        await ws.send(json.dumps(welcome))
        await self._receive(ws)


def test_the_runner_keeps_the_token_it_got_for_the_bootstrap_one_also_after_a_restart(tmp_path: Path) -> None:
    async def go() -> tuple[ExchangingServer, bytes]:
        server = ExchangingServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            runner = await start_runner(port, tmp_path / "rd")
            await server.wait_for(lambda: server.connections == 1, 20)
            await asyncio.sleep(0.5)
            await stop(runner)  # SIGKILL: a crash; systemd starts it again with the same bootstrap token
            again = await start_runner(port, tmp_path / "rd")
            try:
                await server.wait_for(lambda: server.connections == 2, 20)
            finally:
                again.terminate()
                _, err = await asyncio.wait_for(again.communicate(), 30)
        return server, err

    server, err = asyncio.run(go())
    assert server.tokens == [TOKEN, OWN]
    saved = tmp_path / "rd" / machine.TOKEN_FILE
    assert saved.read_text().strip() == OWN
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert OWN.encode() not in err and TOKEN.encode() not in err  # never in the runner's logs


def test_a_second_hello_with_a_spent_bootstrap_token_is_refused_and_the_runner_exits_2(tmp_path: Path) -> None:
    async def go() -> int:
        server = ExchangingServer()
        server.spent = True  # the Welcome with the new token was lost
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                return await asyncio.wait_for(runner.wait(), 20)
            finally:
                await stop(runner)

    assert asyncio.run(go()) == 2


def test_an_idle_runner_cut_off_from_the_server_powers_the_machine_off(tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"

    async def go() -> tuple[int, bytes]:
        runner = await start_runner(
            9, tmp_path / "rd", "--power-off-after", "1", "--power-off-command", f"touch {marker}"
        )
        try:
            _, err = await asyncio.wait_for(runner.communicate(), 20)
            return runner.returncode or 0, err
        finally:
            await stop(runner)

    code, err = asyncio.run(go())
    assert code == 3
    assert marker.exists()
    assert b"server unreachable for 1s while idle; the machine powers off" in err


def test_at_its_maximum_lifetime_the_runner_stops_its_job_reports_it_and_powers_off(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    marker = tmp_path / "powered-off"

    async def go() -> tuple[int | None, FakeServer]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            runner = await start_runner(
                port, tmp_path / "rd", "--max-lifetime", "4", "--power-off-command", f"touch {marker}"
            )
            try:
                await server.to_send.put(assign("j", ["sleep 60"], repo))
                await server.wait_for(lambda: ("running", None) in server.states("j"), 20)
                return await asyncio.wait_for(runner.wait(), 30), server
            finally:
                await stop(runner)

    code, server = asyncio.run(go())
    assert code == 3
    assert marker.exists()
    final = [m for m in server.received if m["type"] == "job_state" and m["state"] == "stopped"]
    assert final and final[0]["reason"] == "the runner reached its maximum lifetime of 4 s"


def test_the_lifetime_counts_from_the_first_start_in_the_work_dir(tmp_path: Path) -> None:
    (tmp_path / "rd").mkdir()
    (tmp_path / "rd" / machine.FIRST_START_FILE).write_text("1000.0\n")  # long ago
    marker = tmp_path / "powered-off"

    async def go() -> int:
        runner = await start_runner(
            9, tmp_path / "rd", "--max-lifetime", "3600", "--power-off-command", f"touch {marker}"
        )
        try:
            return await asyncio.wait_for(runner.wait(), 40)
        finally:
            await stop(runner)

    assert asyncio.run(go()) == 3  # a restarted runner does not start the clock again
    assert marker.exists()


class Imds:
    """An IMDSv2 endpoint: a session token first (PUT), every read with it; v1 reads get 401."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                outer.requests.append(("PUT", self.path))
                ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                self._answer(200 if ok else 400, "imds-session")

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path))
                if self.headers.get("X-aws-ec2-metadata-token") != "imds-session":
                    self._answer(401, "")
                    return
                values = {
                    "/latest/meta-data/instance-id": "i-0123456789abcdef0",
                    "/latest/meta-data/instance-type": "g5.xlarge",
                    "/latest/meta-data/placement/region": "us-east-1",
                    "/latest/meta-data/placement/availability-zone": "us-east-1a",
                    "/latest/dynamic/instance-identity/document": DOCUMENT,
                    "/latest/dynamic/instance-identity/rsa2048": SIGNATURE,
                }
                self._answer(200, values[self.path]) if self.path in values else self._answer(404, "")

            def _answer(self, status: int, body: str) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def imds() -> Iterator[Imds]:
    server = Imds()
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


def test_the_cloud_identity_comes_from_imdsv2_and_never_from_v1(imds: Imds) -> None:
    identity = machine.aws_identity(imds.url)
    assert identity == CloudIdentity(
        instance_id="i-0123456789abcdef0",
        instance_type="g5.xlarge",
        region="us-east-1",
        zone="us-east-1a",
        document=DOCUMENT,
        signature=SIGNATURE,
    )
    assert imds.requests[0] == ("PUT", "/latest/api/token")


def test_no_metadata_service_means_no_identity_within_the_timeout() -> None:
    assert machine.aws_identity("http://127.0.0.1:9") is None


def test_the_hello_carries_the_cloud_identity_with_cloud_aws(tmp_path: Path, imds: Imds) -> None:
    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "trainyard_runner", "--server", f"ws://127.0.0.1:{port}",
                "--work-dir", str(tmp_path / "rd"), "--cloud", "aws",
                env={**os.environ, "TRAINYARD_RUNNER_TOKEN": TOKEN, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url},
            )  # fmt: skip
            try:
                await server.wait_for(lambda: len(server.hellos) == 1, 20)  # the hello, not just the socket
            finally:
                await stop(proc)
        return server

    server = asyncio.run(go())
    assert server.hellos[0]["cloud"] == {
        "instance_id": "i-0123456789abcdef0",
        "instance_type": "g5.xlarge",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "document": DOCUMENT,
        "signature": SIGNATURE,
    }

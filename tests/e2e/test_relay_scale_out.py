"""The relay across web processes: Trainyard scaled out behind haproxy
(tests/support/balanced.py), a local runner connected through the balancer,
a job serving a TCP echo on its port. A session's client connects to one web
process and the runner's end of it lands on the other; the bytes cross
through the channel layer, identical both ways."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.e2e.conftest import User, commit_all, make_repo, run_name_of
from tests.support.balanced import WEBS, BalancedStack, balanced_stack

ECHO = """
import asyncio, os

async def echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()

async def main():
    server = await asyncio.start_server(echo, "127.0.0.1", int(os.environ["PORT_0"]))
    print("echo listening", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""
WORKFLOW = """
  - name: echo
    provider: bash
    ports: 1
    commands:
      - python echo.py
"""
MIB = 1 << 20


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BalancedStack]:
    with balanced_stack(
        tmp_path_factory.mktemp("relay-scale-out"),
        "relay-scaled",
        TRAINYARD_HEARTBEAT_SECONDS="1",
        TRAINYARD_LOCAL_RUNNERS_MAX="1",
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def alice(scaled: BalancedStack) -> User:
    return User("alice", scaled.issue_token("alice"), scaled)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = make_repo(tmp_path / "tiny-train")
    (path / "echo.py").write_text(ECHO)
    workflows = path / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + WORKFLOW)
    commit_all(path, "an echo server")
    return path


def test_a_port_session_crosses_web_processes_with_every_byte_intact_both_ways(
    scaled: BalancedStack, alice: User, repo: Path
) -> None:
    name = run_name_of(alice.cli(repo, "run", "echo", "-d"))
    port = _echo_port(alice, name)
    before = scaled.websockets_on()

    grant = _grant(alice, name, port)
    runner_side = _until(lambda: _new_socket(scaled, before), "the runner's relay socket")
    client_side = next(web for web in WEBS if web != runner_side)
    url = f"{scaled.web_ws_url(client_side)}/ws/v1/relay/{grant['id']}/"
    sent = os.urandom(4 * MIB)

    echoed, end = asyncio.run(_echo_through(url, grant["token"], sent))

    assert echoed == sent
    assert end == {"type": "end", "reason": "the client closed the session"} or end is None
    session = _until(lambda: _ended(alice, grant["id"]), "the session's end")
    assert (session["bytes_up"], session["bytes_down"]) == (len(sent), len(sent))
    audit = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/audit/?kind=session").json()["results"]
    mine = [e for e in audit if e["detail"].get("session") == grant["id"]]
    assert sorted(e["action"] for e in mine) == ["session.end", "session.start"]
    ended = next(e for e in mine if e["action"] == "session.end")
    assert (ended["detail"]["bytes_up"], ended["detail"]["bytes_down"]) == (len(sent), len(sent))
    assert ended["username"] == "alice"
    alice.cli(repo, "stop", name)


def test_a_wrong_token_is_refused_and_stopping_the_job_ends_the_session_saying_so(
    scaled: BalancedStack, alice: User, repo: Path
) -> None:
    name = run_name_of(alice.cli(repo, "run", "echo", "-d"))
    grant = _grant(alice, name, _echo_port(alice, name))
    url = f"{scaled.ws_url}/ws/v1/relay/{grant['id']}/"

    async def scenario() -> tuple[int, dict[str, Any], int]:
        refused = await _close_code(url, "tyses_not-this-one")
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {grant['token']}"}) as ws:
            assert json.loads(await asyncio.wait_for(ws.recv(), 30)) == {"type": "ready"}
            await ws.send(b"ping")
            assert await asyncio.wait_for(ws.recv(), 10) == b"ping"
            await asyncio.to_thread(alice.cli, repo, "stop", name)
            end = json.loads(await asyncio.wait_for(ws.recv(), 30))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
        return refused, end, closed.value.rcvd.code if closed.value.rcvd else 1006

    refused, end, code = asyncio.run(scenario())

    assert refused == 4401
    assert end["type"] == "end" and "job" in end["reason"], end
    assert code in (1000, 4409)
    assert _until(lambda: _ended(alice, grant["id"]), "the session's end")["state"] == "ended"


def test_a_terminal_survives_a_dropped_socket_and_the_client_comes_back_to_the_same_shell(
    scaled: BalancedStack, alice: User, repo: Path
) -> None:
    name = run_name_of(alice.cli(repo, "run", "echo", "-d"))
    _echo_port(alice, name)
    response = alice.api(
        "POST", f"/api/v1/workspaces/{alice.workspace}/runs/{name}/sessions/", json={"kind": "terminal"}
    )
    assert response.status_code == 201, response.text
    grant = response.json()
    headers = {"Authorization": f"Bearer {grant['token']}"}

    async def shell_pid(web: str) -> str:
        async with websockets.connect(
            f"{scaled.web_ws_url(web)}/ws/v1/relay/{grant['id']}/", additional_headers=headers
        ) as ws:
            assert json.loads(await asyncio.wait_for(ws.recv(), 30)) == {"type": "ready"}
            await ws.send(b"echo pid=$$.\n")  # the terminal echoes the line as typed, then the shell's answer
            seen = b""
            while (found := re.search(rb"pid=(\d+)\.", seen)) is None:
                seen += await asyncio.wait_for(ws.recv(), 15)
            return found.group(1).decode()

    first = asyncio.run(shell_pid(WEBS[0]))
    detached = _until(lambda: _state(alice, grant["id"]) == "detached", "the detached state")
    again = asyncio.run(shell_pid(WEBS[1]))

    assert detached and first.isdigit() and again == first
    alice.cli(repo, "stop", name)


# ------------------------------------------------------------------ helpers


async def _close_code(url: str, token: str) -> int:
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    return closed.value.rcvd.code if closed.value.rcvd else 1006


def _state(user: User, session_id: str) -> str:
    sessions = user.api("GET", f"/api/v1/workspaces/{user.workspace}/sessions/").json()
    return next((s["state"] for s in sessions if s["id"] == session_id), "")


async def _echo_through(url: str, token: str, data: bytes) -> tuple[bytes, dict[str, Any] | None]:
    headers = {"Authorization": f"Bearer {token}"}
    async with websockets.connect(url, additional_headers=headers, max_size=1 << 20) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), 30)) == {"type": "ready"}

        async def send() -> None:
            for start in range(0, len(data), 200_000):
                await ws.send(data[start : start + 200_000])

        sender = asyncio.ensure_future(send())
        got = bytearray()
        while len(got) < len(data):
            frame = await asyncio.wait_for(ws.recv(), 30)
            assert isinstance(frame, bytes), frame
            got += frame
        await sender
    return bytes(got), None


def _grant(user: User, run: str, port: int) -> dict[str, Any]:
    response = user.api("POST", f"/api/v1/workspaces/{user.workspace}/runs/{run}/sessions/", json={
        "kind": "port", "port": port, "client": "test"
    })  # fmt: skip
    assert response.status_code == 201, response.text
    return dict(response.json())


def _echo_port(user: User, run: str) -> int:
    """The job's PORT_0, once its echo server listens (its log says so)."""

    def listening() -> int | None:
        job = user.run(run)["jobs"][0]
        if job["status"] != "running" or not job.get("ports"):
            return None
        logs = user.api("GET", f"/api/v1/workspaces/{user.workspace}/jobs/{job['id']}/logs/").json()
        texts = [line["text"] for line in logs.get("lines", [])]
        return int(job["ports"][0]) if any("echo listening" in str(t) for t in texts) else None

    return _until(listening, "the echo server", timeout=90)


def _new_socket(stack: BalancedStack, before: dict[str, int]) -> str | None:
    now = stack.websockets_on()
    grown = [web for web in WEBS if now.get(web, 0) > before.get(web, 0)]
    return grown[0] if len(grown) == 1 else None


def _ended(user: User, session_id: str) -> dict[str, Any] | None:
    sessions = user.api("GET", f"/api/v1/workspaces/{user.workspace}/sessions/").json()
    found = next((s for s in sessions if s["id"] == session_id), None)
    if found is None or found["state"] != "ended":
        return None
    audit = user.api("GET", f"/api/v1/workspaces/{user.workspace}/audit/?kind=session").json()["results"]
    done = any(e["action"] == "session.end" and e["detail"].get("session") == session_id for e in audit)
    return dict(found) if done else None


def _until(check: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout}s")

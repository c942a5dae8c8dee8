from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from trainyard_runner.agent import Agent, default_address
from trainyard_runner.job import Lifecycle


@pytest.mark.parametrize(
    "url",
    ["ws://127.0.0.1:8000/ws/runner/", "http://localhost:8000", "wss://[::1]/ws/runner/", "ws://127.3.4.5:1"],
)
def test_a_loopback_server_means_address_127_0_0_1(url: str) -> None:
    assert default_address(url) == "127.0.0.1"


def test_otherwise_the_address_is_the_local_end_of_the_route_to_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    connected: list[object] = []

    class FakeSocket:
        def __init__(self, family: int, kind: int) -> None:
            assert kind == socket.SOCK_DGRAM  # UDP: connect sends nothing

        def __enter__(self) -> FakeSocket:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def connect(self, addr: object) -> None:
            connected.append(addr)

        def getsockname(self) -> tuple[str, int]:
            return ("192.168.7.20", 40000)

    monkeypatch.setattr(socket, "socket", FakeSocket)
    assert default_address("wss://203.0.113.9/ws/runner/") == "192.168.7.20"
    assert connected == [("203.0.113.9", 443)]


def test_an_unresolvable_server_gives_an_empty_address() -> None:
    assert default_address("ws://no-such-host.invalid:8000") == ""


def test_a_job_draining_or_uploading_keeps_the_runner_busy(tmp_path: Path) -> None:
    async def go() -> list[bool]:
        agent = Agent(server_url="ws://127.0.0.1:9", token="t", work_dir=tmp_path)
        busy = []
        for phase, finished in [
            (Lifecycle.PREPARING, False),
            (Lifecycle.RUNNING, False),
            (Lifecycle.DRAINING, False),
            (Lifecycle.UPLOADING, False),
            (Lifecycle.DRAINING, True),  # only the final state is left to send
        ]:
            agent._jobs = {"j": SimpleNamespace(phase=phase, finished=finished)}  # type: ignore[dict-item]
            busy.append(agent._busy())
        return busy

    assert asyncio.run(go()) == [True, True, True, True, False]

"""``ports: N`` on the runner: a real runner process against the fake
server picks N free ports, names them in its ``job_accepted`` and gives
them to the job as PORT_0 …; the test reaches the job's HTTP server on
PORT_0 while it runs."""

from __future__ import annotations

import asyncio
import sys
import urllib.request
from pathlib import Path
from typing import Any

from trainyard_runner.ports import free_ports, port_env, ports_of
from websockets.asyncio.server import serve

from tests.runner.test_agent import FakeServer, assign, start_runner, stop


def _accepted(server: FakeServer) -> dict[str, Any] | None:
    return next((m for m in server.received if m["type"] == "job_accepted"), None)


def test_a_job_with_two_ports_serves_http_on_port_0_and_the_server_is_told_both(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    serve_page = (
        f'{sys.executable} -c "import http.server, os, socketserver\n'
        "open('index.html', 'w').write('hello from ' + os.environ['PORT_1'])\n"
        "http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT_0'])),"
        ' http.server.SimpleHTTPRequestHandler).serve_forever()"'
    )
    job = assign("web", [serve_page], repo) | {"port_count": 2}

    async def go() -> tuple[list[int], str]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                await server.to_send.put(job)
                for _ in range(200):
                    if _accepted(server):
                        break
                    await asyncio.sleep(0.05)
                accepted = _accepted(server)
                assert accepted is not None, server.received
                ports = list(accepted["ports"])
                page = ""
                for _ in range(200):
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/index.html", timeout=2) as r:
                            page = r.read().decode()
                            break
                    except OSError:
                        await asyncio.sleep(0.1)
                return ports, page
            finally:
                await stop(runner)

    ports, page = asyncio.run(go())
    assert len(ports) == 2 and len(set(ports)) == 2 and all(1024 <= p <= 65535 for p in ports)
    assert page == f"hello from {ports[1]}"


def test_free_ports_differ_and_round_trip_through_the_env() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert ports_of(port_env(ports), 5) == ports
    assert ports_of({}, 2) == [] and ports_of(port_env(ports), 0) == []

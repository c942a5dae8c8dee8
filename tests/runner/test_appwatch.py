"""The runner asks a Jupyter dev environment when it was last active, with
its token, on loopback: its ``last_activity``, or now while a kernel is busy;
nothing when Jupyter refuses or is not up."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from trainyard_runner.appwatch import AppWatch

TOKEN = "jupyter-token-of-the-job"


class _Jupyter(BaseHTTPRequestHandler):
    """Jupyter's two answers the watch reads, and the requests it got."""

    last_activity = "2026-01-02T03:04:05.000000Z"
    kernels: list[dict[str, Any]] = []
    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        type(self).seen.append((self.path, self.headers.get("Authorization", "")))
        if self.headers.get("Authorization") != f"token {TOKEN}":
            self.send_response(403)
            self.end_headers()
            return
        body = {"/api/status": {"last_activity": self.last_activity, "kernels": len(self.kernels)}}.get(
            self.path, self.kernels
        )
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def jupyter() -> Iterator[int]:
    _Jupyter.kernels, _Jupyter.seen = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Jupyter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_an_idle_jupyters_last_activity_is_read_with_its_token_without_counting_as_activity(jupyter: int):
    found = AppWatch(jupyter, TOKEN).probe()

    assert found == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()
    assert _Jupyter.seen == [
        ("/api/status", f"token {TOKEN}"),
        ("/api/kernels?no_track_activity=1", f"token {TOKEN}"),
    ]


def test_a_busy_kernel_is_activity_now(jupyter: int):
    _Jupyter.kernels = [{"id": "k1", "execution_state": "idle"}, {"id": "k2", "execution_state": "busy"}]
    before = time.time()
    found = AppWatch(jupyter, TOKEN).probe()
    assert found is not None and before <= found <= time.time()


def test_a_refusal_or_no_jupyter_is_nothing(jupyter: int):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nothing_there = closed.getsockname()[1]
    assert AppWatch(jupyter, "wrong").probe() is None
    assert AppWatch(nothing_there, TOKEN).probe() is None


def test_the_watch_keeps_the_latest_and_says_how_long_ago(jupyter: int):
    _Jupyter.last_activity = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    watch = AppWatch(jupyter, TOKEN, every=0.05)

    async def watched() -> float | None:
        task = asyncio.create_task(watch.run())
        try:
            for _ in range(100):
                if watch.active_at is not None:
                    break
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
        return watch.idle_seconds()

    idle = asyncio.run(watched())
    assert idle is not None and 0 <= idle < 5

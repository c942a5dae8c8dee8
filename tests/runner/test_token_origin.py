"""The runner sends its token to one origin only: the one the server names
in its welcome (on the runner's own connection), else the one it connected
to, or ``--api-origin``. An assignment naming another API origin (written
into Redis, or by a misconfigured server) gets its calls refused before a
byte leaves the machine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from trainyard_runner import http
from trainyard_runner.http import HttpError, get_json, pin_token_origin
from websockets.asyncio.server import serve

from tests.runner.test_agent import FakeServer, _ended, assign, start_runner, stop


class _Recording:
    """An HTTP server that answers ``{}`` and records every request's headers."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                seen.append(dict(self.headers))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"env": {}, "credential": null}')

            do_POST = do_GET

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def recording() -> Iterator[_Recording]:
    server = _Recording()
    yield server
    server.httpd.shutdown()


@pytest.fixture
def pinned() -> Iterator[None]:
    yield
    http._token_origin = ""  # the pin is per process: unpin for the next test


def test_a_pinned_runner_sends_its_token_to_its_origin_and_nowhere_else(recording: _Recording, pinned: None) -> None:
    other = _Recording()
    try:
        assert pin_token_origin(recording.url.replace("http://", "ws://") + "/ws/runner/") == recording.url

        assert get_json(f"{recording.url}/api/v1/x/", token="tyrun_secret") == {"env": {}, "credential": None}
        with pytest.raises(HttpError, match=r"refused here: the runner sends its token only to http://127\.0\.0\.1:"):
            get_json(f"{other.url}/api/v1/x/", token="tyrun_secret")
        # Same host, another scheme or port is another origin too.
        with pytest.raises(HttpError, match="refused here") as refused:
            get_json(recording.url.replace("http://", "https://") + "/api/v1/x/", token="tyrun_secret")
    finally:
        other.httpd.shutdown()

    assert [h.get("Authorization") for h in recording.seen] == ["Bearer tyrun_secret"]
    assert other.seen == []
    assert not refused.value.recoverable  # a refusal here is not retried


def test_pin_refuses_what_is_not_a_url(pinned: None) -> None:
    with pytest.raises(ValueError, match="not an http"):
        pin_token_origin("127.0.0.1:8000")


def test_an_assignment_naming_another_api_origin_fails_the_job_and_that_origin_sees_nothing(
    tmp_path: Path, repo: tuple[Path, str], recording: _Recording
) -> None:
    job = {**assign("j", ["echo never"], repo), "secrets": True, "api_url": f"{recording.url}/api/v1"}

    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")  # pinned to the ws
            try:
                await server.to_send.put(job)
                await server.wait_for(lambda: ("failed", None) in server.states("j"), 20)
            finally:
                await stop(runner)
        return server

    server = asyncio.run(go())

    final = [m for m in server.received if m["type"] == "job_state" and m["job"] == "j"][-1]
    assert final["reason"].startswith("could not fetch the job's secrets: GET http://127.0.0.1:")
    assert "refused here: the runner sends its token only to http://127.0.0.1:" in final["reason"]
    assert recording.seen == []
    assert "j" not in server.stored  # the commands never ran


def test_the_origin_the_welcome_names_is_the_one_the_token_goes_to(
    tmp_path: Path, repo: tuple[Path, str], recording: _Recording
) -> None:
    """A runner that reaches the server by another address (a proxy, a
    private name) than the server's public URL: the welcome names the API's
    origin, and the job's calls go there; an assignment naming a third
    origin is still refused."""
    good = {**assign("good", ["echo ran"], repo), "secrets": True, "api_url": f"{recording.url}/api/v1"}
    elsewhere = _Recording()
    bad = {**assign("bad", ["echo never"], repo), "secrets": True, "api_url": f"{elsewhere.url}/api/v1"}

    async def go() -> FakeServer:
        server = FakeServer()
        server.welcome_extra = {"api_origin": recording.url}
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                for job in (good, bad):
                    await server.to_send.put(job)
                    await server.wait_for(partial(_ended, server, job["job"]), 20)
            finally:
                await stop(runner)
        return server

    try:
        server = asyncio.run(go())
    finally:
        elsewhere.httpd.shutdown()

    assert server.states("good")[-1] == ("succeeded", 0)
    assert [t for _, _, t in server.stored["good"]] == ["ran"]
    assert [h.get("Authorization", "").split(".")[0] for h in recording.seen] == ["Bearer runner-token"]
    assert server.states("bad")[-1] == ("failed", None)
    assert elsewhere.seen == []

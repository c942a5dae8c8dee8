"""The SDK's retries against a real HTTP server that answers from a script:
5xx and dropped connections asked again when asking twice does no harm,
``Retry-After`` of a 429 and a 503 waited for, the total wait bounded.
Real sockets and real waits (short ones)."""

from __future__ import annotations

import hashlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from trainyard import api

WS = "/api/v1/workspaces/ws1"


class Scripted:
    """An HTTP server answering each request with the next step of ``script``:
    (status, headers) or "drop" (the connection closed without an answer)."""

    def __init__(self, script: list[tuple[int, dict[str, str]] | str]) -> None:
        self.script = list(script)
        self.seen: list[tuple[str, str, float, dict[str, str]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                owner.seen.append((self.command, self.path, time.monotonic(), dict(self.headers)))
                step = owner.script.pop(0) if owner.script else (200, {})
                if step == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                status, headers = step
                body = json.dumps({"message": f"answer {status}", "ok": status < 400}).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def gaps(self) -> list[float]:
        times = [t for _, _, t, _ in self.seen]
        return [round(b - a, 2) for a, b in itertools.pairwise(times)]


@pytest.fixture
def serve() -> Iterator[type[Scripted]]:
    started: list[Scripted] = []

    def make(script: list[tuple[int, dict[str, str]] | str]) -> Scripted:
        server = Scripted(script)
        started.append(server)
        return server

    yield make  # type: ignore[misc]
    for server in started:
        server.server.shutdown()
        server.server.server_close()


@pytest.fixture(autouse=True)
def _short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "RETRY_WAITS", (0.1, 0.2, 0.3))


def client(url: str) -> api.Client:
    return api.Client(url, "trainyard_test", "ws1")


def test_a_get_that_meets_5xx_and_a_dropped_connection_is_asked_again_until_it_succeeds(serve) -> None:
    server = serve([(502, {}), "drop", (503, {}), (200, {})])
    with client(server.url) as c:
        assert c.list_tags() == {"message": "answer 200", "ok": True}
    assert [(m, p) for m, p, _, _ in server.seen] == [("GET", f"{WS}/tags/")] * 4
    assert all(gap >= 0.1 for gap in server.gaps()), server.gaps()


def test_a_get_gives_up_after_its_retries_with_the_servers_message(serve) -> None:
    server = serve([(500, {})] * 10)
    with client(server.url) as c, pytest.raises(api.ApiError) as raised:
        c.list_tags()
    assert (raised.value.status, raised.value.message, len(server.seen)) == (500, "answer 500", 4)


def test_a_429_waits_its_retry_after_in_seconds_and_as_a_date_whatever_the_method(serve) -> None:
    # An HTTP date has whole seconds: asked again about 1 s later, this one is 1 to 3 s away
    # (without a Retry-After the wait would be RETRY_WAITS[0], 0.1 s here).
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=4), usegmt=True)
    server = serve([(429, {"Retry-After": "1"}), (429, {"Retry-After": soon}), (201, {})])
    with client(server.url) as c:
        c.create_volume({"name": "scratch", "size": "1GB"})  # a POST without a key: a 429 did nothing
    assert [m for m, _, _, _ in server.seen] == ["POST"] * 3
    first, second = server.gaps()
    assert 1.0 <= first < 1.6 and 1.0 <= second < 3.2, server.gaps()


def test_a_503_with_retry_after_is_waited_for_on_a_get(serve) -> None:
    server = serve([(503, {"Retry-After": "1"}), (200, {})])
    with client(server.url) as c:
        c.list_tags()
    assert len(server.seen) == 2 and server.gaps()[0] >= 1.0


def test_a_post_without_an_idempotency_key_is_not_repeated_after_a_5xx_or_a_lost_answer(serve) -> None:
    server = serve([(502, {}), "drop", (201, {})])
    with client(server.url) as c:
        with pytest.raises(api.ApiError) as raised:
            c.create_volume({"name": "scratch"})
        assert raised.value.status == 502
        with pytest.raises(api.ApiError) as lost:
            c.create_volume({"name": "scratch"})
        assert lost.value.status is None
    assert len(server.seen) == 2


def test_a_submission_is_repeated_with_the_same_idempotency_key(serve) -> None:
    server = serve(["drop", (503, {}), (201, {})])
    with client(server.url) as c:
        c.create_run(code={"repo_url": "x", "commit": "a" * 40}, workflow="hello", workflows_file_text="w")
    keys = [h.get("Idempotency-Key") for _, _, _, h in server.seen]
    assert len(keys) == 3 and keys[0] and len(set(keys)) == 1, keys


def test_the_total_wait_of_one_request_is_bounded(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "MAX_TOTAL_WAIT_SECONDS", 2.5)
    server = serve([(429, {"Retry-After": "1"})] * 10)
    started = time.monotonic()
    with client(server.url) as c, pytest.raises(api.ApiError) as raised:
        c.list_tags()
    assert raised.value.status == 429
    assert (len(server.seen), round(time.monotonic() - started)) == (3, 2)


def test_a_server_that_is_not_there_is_asked_a_few_times_then_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with client(f"http://127.0.0.1:{port}") as c, pytest.raises(api.ServerUnreachable) as raised:
        c.list_tags()
    assert (
        raised.value.message == f"cannot reach Trainyard at http://127.0.0.1:{port}: is the server running (make run)?"
    )
    assert 1.75 <= time.monotonic() - started < 5


def test_a_download_whose_connection_breaks_midway_continues_from_where_it_broke(tmp_path) -> None:
    body = bytes(range(256)) * 4096 * 4  # 4 MiB: the client writes whole MiBs as they come
    ranges: list[str | None] = []

    class Storage(BaseHTTPRequestHandler):
        """The file endpoint redirects to its bytes; the first answer breaks after 2.5 MiB of them."""

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.endswith("/files/w.bin"):
                self.send_response(302)
                self.send_header("Location", "/signed/w.bin")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            asked = self.headers.get("Range")
            ranges.append(asked)
            start = int(asked.removeprefix("bytes=").rstrip("-")) if asked else 0
            self.send_response(206 if asked else 200)
            self.send_header("Content-Length", str(len(body) - start))
            if asked:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.end_headers()
            if len(ranges) == 1:
                self.wfile.write(body[: 5 << 19])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(body[start:])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Storage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    counted: list[int] = []
    try:
        with client(f"http://127.0.0.1:{server.server_address[1]}") as c:
            part = tmp_path / "w.bin.trainyard-part"
            size, digest, resumed = c.fetch_artifact_file("a1", "w.bin", part, on_bytes=counted.append)
    finally:
        server.shutdown()
        server.server_close()
    assert part.read_bytes() == body
    assert (size, resumed, sum(counted)) == (len(body), 0, len(body))
    assert digest == hashlib.sha256(body).hexdigest()
    assert ranges == [None, f"bytes={2 << 20}-"]  # the 2 MiB written before the break are kept

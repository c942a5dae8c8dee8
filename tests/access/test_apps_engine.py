"""The apps proxy's engine against a real HTTP and websocket server, over TCP
streams: what the app sees of a request, bodies both ways, keep-alive
streams reused, a missing app's 502 page, websockets both ways."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import websockets

from backend.access.webapps.forward import Target, Unavailable, forward_http, forward_websocket
from backend.access.webapps.http11 import request_headers
from backend.access.webapps.stream import ByteStream, StreamPool
from tests.support.asgiserve import serving

BIG = 5 * 1024 * 1024
DROPPED = frozenset({"sessionid", "csrftoken", "trainyard-app"})


class TcpStream:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read(self) -> bytes:
        return await self.reader.read(65536)


def tcp(port: int, opened: list[int] | None = None) -> Any:
    @asynccontextmanager
    async def opener() -> AsyncIterator[ByteStream]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if opened is not None:
            opened.append(port)
        try:
            yield TcpStream(reader, writer)
        finally:
            writer.close()

    return opener


class JobApp:
    """What a job serves: an echo of the request, a big body, a websocket echo; it counts its connections."""

    def __init__(self) -> None:
        self.clients: set[tuple[str, int]] = set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.clients.add(tuple(scope["client"]))  # type: ignore[arg-type]
        if scope["type"] == "websocket":
            await self._echo_socket(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/big":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(BIG // 65536):
                await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        seen = {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode(),
            "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
            "body_sha256": hashlib.sha256(body).hexdigest(),
        }
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"set-cookie", b"_xsrf=abc; Domain=apps.localhost; Path=/; HttpOnly"),
                    (b"set-cookie", b"trainyard-app=forged-by-the-app; Path=/"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps(seen).encode()})

    async def _echo_socket(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        protocols = scope.get("subprotocols") or []
        await send({"type": "websocket.accept", "subprotocol": protocols[0] if protocols else None})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") == "bye":
                await send({"type": "websocket.close", "code": 4321, "reason": "bye to you"})
                return
            await send({"type": "websocket.send", "text": message.get("text"), "bytes": message.get("bytes")})


def proxy(pool: StreamPool, target: Target) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        extra = {"X-Forwarded-Proto": "http"}
        headers = request_headers(scope, drop_cookies=DROPPED, extra=extra)
        if scope["type"] == "websocket":
            await forward_websocket(target, scope=scope, receive=receive, send=send, headers=headers)
        else:
            await forward_http(pool, target, scope=scope, receive=receive, send=send, headers=headers)

    return app


@asynccontextmanager
async def through_proxy(job: Any, *, pool: StreamPool | None = None, **job_config: Any) -> AsyncIterator[Any]:
    pool = pool or StreamPool()
    opened: list[int] = []
    async with serving(job, **job_config) as job_port:
        target = Target(
            key="app", opener=tcp(job_port, opened), label=f"port {job_port} in job train", reserved_cookies=DROPPED
        )
        async with serving(proxy(pool, target)) as port:
            yield port, opened, pool
    await pool.close_all()


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def _until(condition: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def test_the_app_sees_the_request_without_the_dashboards_cookies_and_its_cookies_stay_on_its_origin() -> None:
    """Nor may it set the pass's cookie."""

    async def scenario() -> None:
        async with through_proxy(JobApp()) as (port, _, _), httpx.AsyncClient() as client:
            response = await client.get(
                f"http://127.0.0.1:{port}/api/contents?x=1",
                headers={"Host": "abc.apps.localhost:8000", "Cookie": "sessionid=s; theirs=1; trainyard-app=t"},
            )
        assert response.status_code == 201
        seen = response.json()
        headers = dict(seen["headers"])
        assert (seen["method"], seen["path"], seen["query"]) == ("GET", "/api/contents", "x=1")
        assert headers["cookie"] == "theirs=1"
        assert headers["host"] == "abc.apps.localhost:8000"
        assert headers["x-forwarded-proto"] == "http"
        assert response.headers["set-cookie"] == "_xsrf=abc; Path=/; HttpOnly"

    run(scenario())


def test_request_and_response_bodies_stream_through_byte_identical() -> None:
    body = bytes(range(256)) * (3 * 4096)

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 100_000):
            yield body[i : i + 100_000]

    async def scenario() -> None:
        async with through_proxy(JobApp()) as (port, _, _), httpx.AsyncClient() as client:
            posted = await client.post(f"http://127.0.0.1:{port}/upload", content=chunks())
            fixed = await client.put(f"http://127.0.0.1:{port}/upload", content=body)
            big = await client.get(f"http://127.0.0.1:{port}/big")
        assert posted.json()["body_sha256"] == hashlib.sha256(body).hexdigest()
        assert fixed.json()["body_sha256"] == hashlib.sha256(body).hexdigest()
        assert big.content == b"x" * BIG

    run(scenario())


def test_sequential_requests_of_one_app_reuse_one_stream_until_it_idles_out() -> None:
    job = JobApp()

    async def scenario() -> None:
        pool = StreamPool(idle_seconds=0.5)
        async with through_proxy(job, pool=pool) as (port, opened, _), httpx.AsyncClient() as client:
            for _ in range(5):
                assert (await client.get(f"http://127.0.0.1:{port}/echo")).status_code == 201
            await _until(lambda: pool.idle_count("app") == 1)  # given back just after the answer
            assert (len(opened), len(job.clients)) == (1, 1)
            await asyncio.sleep(1.2)
            assert pool.idle_count("app") == 0
            assert (await client.get(f"http://127.0.0.1:{port}/echo")).status_code == 201
        assert len(opened) == 2

    run(scenario())


def test_a_stream_the_app_closed_while_idle_is_replaced_without_an_error() -> None:
    async def scenario() -> None:
        async with through_proxy(JobApp(), timeout_keep_alive=1) as (port, opened, _), httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/echo")).status_code == 201
            await asyncio.sleep(1.5)
            assert (await client.get(f"http://127.0.0.1:{port}/echo")).status_code == 201
        assert len(opened) == 2

    run(scenario())


def test_nothing_listening_is_a_502_page_naming_the_port_and_the_job() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    target = Target(key="app", opener=tcp(dead_port), label="port 8888 in job train of run funny-cat-1")

    async def scenario() -> httpx.Response:
        async with serving(proxy(StreamPool(), target)) as port, httpx.AsyncClient() as client:
            return await client.get(f"http://127.0.0.1:{port}/lab")

    response = run(scenario())
    assert response.status_code == 502
    assert "Nothing is listening on port 8888 in job train of run funny-cat-1" in response.text
    assert "Traceback" not in response.text


def test_a_stream_that_may_not_be_opened_now_gets_the_browser_the_reason_and_its_status() -> None:
    @asynccontextmanager
    async def capped() -> AsyncIterator[ByteStream]:
        raise Unavailable(429, "you have 20 live sessions, the most one user may hold")
        yield  # an async generator, for asynccontextmanager

    target = Target(key="app", opener=capped, label="port 8888 in job train")

    async def scenario() -> httpx.Response:
        async with serving(proxy(StreamPool(), target)) as port, httpx.AsyncClient() as client:
            return await client.get(f"http://127.0.0.1:{port}/")

    response = run(scenario())
    assert response.status_code == 429
    assert "you have 20 live sessions, the most one user may hold" in response.text


def test_an_app_answering_garbage_is_a_502_page() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        await writer.drain()
        writer.close()

    async def scenario() -> httpx.Response:
        server = await asyncio.start_server(garbage, "127.0.0.1", 0)
        target = Target(key="app", opener=tcp(server.sockets[0].getsockname()[1]), label="port 22 in job train")
        async with server, serving(proxy(StreamPool(), target)) as port, httpx.AsyncClient() as client:
            return await client.get(f"http://127.0.0.1:{port}/")

    response = run(scenario())
    assert response.status_code == 502
    assert "port 22 in job train" in response.text


def test_a_websocket_round_trips_text_and_bytes_with_its_subprotocol_and_the_apps_close_code() -> None:
    async def scenario() -> None:
        async with (
            through_proxy(JobApp()) as (port, _, _),
            websockets.connect(
                f"ws://127.0.0.1:{port}/api/kernels/k/channels", subprotocols=["v1.kernel.websocket.jupyter.org"]
            ) as ws,
        ):
            assert ws.subprotocol == "v1.kernel.websocket.jupyter.org"
            await ws.send("1+1")
            assert await ws.recv() == "1+1"
            payload = bytes(range(256)) * 4096
            await ws.send(payload)
            assert await ws.recv() == payload
            await ws.send("bye")
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4321, "bye to you")

    run(scenario())


def test_a_websocket_to_an_app_that_is_not_there_is_refused() -> None:
    target = Target(key="app", opener=tcp(1), label="port 1 in job train")

    async def scenario() -> None:
        async with serving(proxy(StreamPool(), target)) as port:
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with websockets.connect(f"ws://127.0.0.1:{port}/ws"):
                    pass
        assert refused.value.response.status_code == 403

    run(scenario())

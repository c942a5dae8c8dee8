"""One HTTP/1.1 exchange over a byte stream: the browser's ASGI request
written with h11, the app's response read with h11 and streamed back.

Bodies stream both ways with backpressure (nothing is held but one chunk);
the response head is bounded (``MAX_HEAD_BYTES``) and must arrive within
``HEAD_TIMEOUT_SECONDS``; a request body is capped at ``MAX_BODY_BYTES``.
Hop-by-hop headers are dropped both ways (RFC 9110 §7.6.1); a ``Domain``
attribute is dropped from the app's cookies, so an app's cookies stay on its
own origin and never reach a sibling app or the dashboard's domain.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11

from backend.access.webapps.stream import ByteStream, wait_first

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024**3
HEAD_TIMEOUT_SECONDS = 120.0
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)


class NothingAnswered(Exception):
    """The stream ended (or the app sent garbage) before a response head: nothing was sent to the browser."""


class BodyTooLarge(Exception):
    """The browser's request body passed ``MAX_BODY_BYTES``."""


@dataclass(frozen=True)
class Exchange:
    """How it went: ``status`` the app's answer; ``reusable``: the stream may
    carry the next request (both sides finished, keep-alive)."""

    status: int
    reusable: bool


async def exchange(
    stream: ByteStream,
    *,
    scope: Message,
    receive: Receive,
    send: Send,
    headers: Headers,
    reserved_cookies: frozenset[str] = frozenset(),
) -> Exchange:
    """Forwards the request of ``scope`` with ``headers`` (already filtered:
    ``request_headers``) and streams the answer to ``send``.

    Raises ``NothingAnswered`` when no response head came (the caller may try
    a fresh stream, or answer 502), ``BodyTooLarge`` before anything was sent
    to the browser. Once the head is sent, a broken stream ends the response
    short (the browser sees a cut connection). The app may not set the
    cookies named in ``reserved_cookies``."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
    try:
        await _send_request(conn, stream, scope=scope, receive=receive, headers=headers)
        response = await _response_head(conn, stream)
    except (NothingAnswered, BodyTooLarge):
        raise
    except Exception as error:  # the stream broke (a reset, the relay's end): nothing reached the browser yet
        raise NothingAnswered(f"the connection to the app failed: {error or type(error).__name__}") from error
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": response_headers(response.headers, reserved_cookies=reserved_cookies),
        }
    )
    finished = False

    async def pump() -> None:
        nonlocal finished
        await _pump_body(conn, stream, send)
        finished = True

    await wait_first(pump(), _disconnected(receive))
    reusable = finished and conn.our_state is h11.DONE and conn.their_state is h11.DONE
    return Exchange(status=response.status_code, reusable=reusable)


def request_headers(
    scope: Message, *, drop_cookies: frozenset[str], extra: dict[str, str], drop: frozenset[str] = frozenset()
) -> Headers:
    """The browser's headers minus hop-by-hop ones, those named in ``drop``
    and the cookies named in ``drop_cookies``, plus ``extra`` (replacing
    headers of the same names)."""
    replaced = {name.lower().encode("latin-1") for name in (*extra, *drop)}
    kept: Headers = []
    for name, value in scope["headers"]:
        name = name.lower()
        if name in HOP_BY_HOP or name in replaced or name == b"content-length":
            continue
        if name == b"cookie":
            value = _without_cookies(value, drop_cookies)
            if not value:
                continue
        kept.append((name, value))
    kept.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items())
    return kept


def response_headers(headers: Any, *, reserved_cookies: frozenset[str] = frozenset()) -> Headers:
    """The app's response headers (h11's list of name, value pairs) to pass on."""
    kept: Headers = []
    for name, value in headers:
        if name in HOP_BY_HOP:
            continue
        if name == b"set-cookie":
            if value.decode("latin-1").partition("=")[0].strip() in reserved_cookies:
                continue
            value = _without_domain(value)
        kept.append((name, value))
    return kept


# --- request -------------------------------------------------------------------


async def _send_request(
    conn: h11.Connection, stream: ByteStream, *, scope: Message, receive: Receive, headers: Headers
) -> None:
    """1. Reads the first body chunk; 2. frames the body: Content-Length when
    the browser gave one (or the whole body is that chunk), else chunked;
    3. writes the head and streams the rest."""
    first = await receive()
    body, more = first.get("body", b""), first.get("more_body", False)
    declared = _content_length(scope)
    if declared is not None and declared > MAX_BODY_BYTES:
        raise BodyTooLarge
    framed = list(headers)
    if declared is not None:
        framed.append((b"content-length", str(declared).encode()))
    elif more:
        framed.append((b"transfer-encoding", b"chunked"))
    elif body or scope["method"] in {"POST", "PUT", "PATCH"}:
        framed.append((b"content-length", str(len(body)).encode()))
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    request = h11.Request(method=scope["method"], target=target, headers=framed)
    await stream.write(conn.send(request) or b"")
    sent = 0
    while True:
        sent += len(body)
        if sent > MAX_BODY_BYTES:
            raise BodyTooLarge
        if body:
            await stream.write(conn.send(h11.Data(data=body)) or b"")
        if not more:
            break
        message = await receive()
        if message["type"] == "http.disconnect":
            raise NothingAnswered("the browser went away while sending its request")
        body, more = message.get("body", b""), message.get("more_body", False)
    await stream.write(conn.send(h11.EndOfMessage()) or b"")


def _content_length(scope: Message) -> int | None:
    for name, value in scope["headers"]:
        if name.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


# --- response ------------------------------------------------------------------


async def _response_head(conn: h11.Connection, stream: ByteStream) -> h11.Response:
    try:
        async with asyncio.timeout(HEAD_TIMEOUT_SECONDS):
            while True:
                event = await _next_event(conn, stream)
                if isinstance(event, h11.Response):
                    return event
                if isinstance(event, h11.ConnectionClosed):
                    raise NothingAnswered("the app closed the connection without answering")
                # h11.InformationalResponse (100 Continue): the final answer follows.
    except h11.RemoteProtocolError as error:
        raise NothingAnswered(f"the app's answer is not HTTP/1.1: {error}") from error
    except TimeoutError as error:
        raise NothingAnswered(f"the app did not answer within {HEAD_TIMEOUT_SECONDS:.0f} s") from error


async def _pump_body(conn: h11.Connection, stream: ByteStream, send: Send) -> None:
    while True:
        try:
            event = await _next_event(conn, stream)
        except h11.RemoteProtocolError:
            return  # cut short: the browser's response ends without its final chunk
        if isinstance(event, h11.Data):
            await send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
        elif isinstance(event, h11.EndOfMessage):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        elif isinstance(event, h11.ConnectionClosed):
            return


async def _next_event(conn: h11.Connection, stream: ByteStream) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.read())


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# --- cookies -------------------------------------------------------------------


def _without_cookies(header: bytes, names: frozenset[str]) -> bytes:
    pairs = [p.strip() for p in header.decode("latin-1").split(";")]
    kept = [p for p in pairs if p and p.partition("=")[0].strip() not in names]
    return "; ".join(kept).encode("latin-1")


def _without_domain(set_cookie: bytes) -> bytes:
    parts = set_cookie.decode("latin-1").split(";")
    kept = [parts[0]] + [p for p in parts[1:] if p.strip().partition("=")[0].strip().lower() != "domain"]
    return ";".join(kept).encode("latin-1")

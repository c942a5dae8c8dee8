"""The proxy engine: a browser's request or websocket to one app, forwarded
over a stream to the job's port, an idle stream reused when there is one.

An app that is not there (nothing listening, the job gone, an answer that is
not HTTP) gets the browser a 502 page that says which port of which job,
never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass

from backend.access.webapps import http11, pages, websocket
from backend.access.webapps.http11 import Headers, Message, Receive, Send
from backend.access.webapps.stream import StreamOpener, StreamPool, Upstream, upstream_open

logger = logging.getLogger(__name__)


class Unavailable(Exception):
    """The opener may not open a stream now (a cap reached, the job moved on):
    the browser gets ``status`` and the message instead of a 502."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Target:
    """Where a request goes: ``key`` names the pool's streams (an app and a
    user), ``opener`` opens a new one, ``label`` says it for people
    ("port 8888 in job train of run funny-cat-1"); the app may not set the
    ``reserved_cookies``."""

    key: Hashable
    opener: StreamOpener
    label: str
    reserved_cookies: frozenset[str] = frozenset()


async def forward_http(
    pool: StreamPool, target: Target, *, scope: Message, receive: Receive, send: Send, headers: Headers
) -> None:
    """1. Takes an idle stream or opens one; 2. forwards the exchange; 3. gives
    a finished keep-alive stream back to the pool. A reused stream that ends
    before answering (the app closed it while idle) is replaced once, for a
    request without a body; any other failure before the answer is a 502."""
    try:
        upstream = await pool.take(target.key, target.opener)
    except Unavailable as refused:
        await pages.send_page(send, refused.status, pages.refused(str(refused)))
        return
    except Exception as error:
        await _bad_gateway(send, target, error)
        return
    try:
        outcome = await http11.exchange(
            upstream.stream,
            scope=scope,
            receive=receive,
            send=send,
            headers=headers,
            reserved_cookies=target.reserved_cookies,
        )
    except http11.NothingAnswered as error:
        await upstream.close()
        if upstream.reused and not _has_body(scope):
            await _retry_fresh(target, scope=scope, receive=receive, send=send, headers=headers)
        else:
            await _bad_gateway(send, target, error)
        return
    except http11.BodyTooLarge:
        await upstream.close()
        await pages.send_page(send, 413, pages.too_large(target.label, http11.MAX_BODY_BYTES))
        return
    except BaseException:
        await upstream.close()
        raise
    await _settle(pool, target, upstream, outcome.reusable)


async def forward_websocket(target: Target, *, scope: Message, receive: Receive, send: Send, headers: Headers) -> None:
    """The browser's websocket to the app, on a stream of its own; refused
    (closed before accepting: the browser sees 403) when the app is not there
    or does not accept it."""
    if (await receive())["type"] != "websocket.connect":
        return
    try:
        upstream = await upstream_open(target.opener)
    except Exception as error:
        logger.info("app websocket to %s: no stream: %s", target.label, error)
        await send({"type": "websocket.close", "code": 1011})
        return
    try:
        await websocket.bridge(upstream.stream, scope=scope, receive=receive, send=send, headers=headers)
    except websocket.Refused as error:
        logger.info("app websocket to %s refused: %s", target.label, error)
        await send({"type": "websocket.close", "code": 1011})
    finally:
        await upstream.close()


async def _retry_fresh(target: Target, *, scope: Message, receive: Receive, send: Send, headers: Headers) -> None:
    try:
        upstream = await upstream_open(target.opener)
    except Exception as error:
        await _bad_gateway(send, target, error)
        return
    try:
        await http11.exchange(
            upstream.stream,
            scope=scope,
            receive=_no_body(receive),
            send=send,
            headers=headers,
            reserved_cookies=target.reserved_cookies,
        )
    except http11.NothingAnswered as error:
        await _bad_gateway(send, target, error)
    finally:
        await upstream.close()


async def _settle(pool: StreamPool, target: Target, upstream: Upstream, reusable: bool) -> None:
    if reusable:
        await pool.give_back(target.key, upstream)
    else:
        await upstream.close()


async def _bad_gateway(send: Send, target: Target, error: BaseException) -> None:
    logger.info("app %s did not answer: %s", target.label, error)
    await pages.send_page(send, 502, pages.not_listening(target.label, str(error)))


def _has_body(scope: Message) -> bool:
    headers = dict(scope["headers"])
    return headers.get(b"content-length", b"0") not in {b"", b"0"} or b"transfer-encoding" in headers


def _no_body(receive: Receive) -> Receive:
    """The request was read already (it had no body): an empty body, then whatever the browser sends next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return await receive()

    return replay

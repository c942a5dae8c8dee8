"""The apps origin's ASGI app: every request whose host is on the apps
domain (``origin.AppsOrigin.covers``) comes here, never to Django's views.

``/_trainyard/enter?code=…`` swaps the dashboard's one-time code for the
app pass cookie; every other request must carry a pass for the host's app
that still holds (``passes.pass_check``, cached ``CHECK_SECONDS``), and is
forwarded to the job's port without it or any dashboard cookie
(``forward``). A websocket, and any request that can change state, must come
from the app's own origin: another app's page (same site, so its browser
sends the pass along) is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.conf import settings

from backend.access.relay import open_job_stream
from backend.access.services.sessions import AccessRefused
from backend.access.webapps import pages, passes
from backend.access.webapps.forward import Target, Unavailable, forward_http, forward_websocket
from backend.access.webapps.http11 import Message, Receive, Send, request_headers
from backend.access.webapps.origin import AppsOrigin
from backend.access.webapps.passes import AppPass, Checked
from backend.access.webapps.stream import ByteStream, StreamOpener, StreamPool
from backend.core.origins import scope_ip

logger = logging.getLogger(__name__)

ENTER_PATH = "/_trainyard/enter"
CHECK_SECONDS = 2.0
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_MAX_CHECKED = 10_000

pool = StreamPool()
_checked: dict[str, tuple[float, Checked]] = {}


PASS_COOKIES = frozenset({"__Host-trainyard-app", "trainyard-app"})
# Set by the client and believed by some apps; the proxy says who is asking itself.
CLIENT_CLAIMS = frozenset({"Forwarded", "X-Real-IP"})


def cookie_name(apps: AppsOrigin) -> str:
    """``__Host-`` over HTTPS: the browser then keeps it host-only, Secure, Path=/ (no sibling can set it)."""
    return "__Host-trainyard-app" if apps.secure else "trainyard-app"


def serves_apps(scope: Message) -> bool:
    """The request's host is on the apps domain (apps are served at all)."""
    apps: AppsOrigin | None = settings.APPS
    if apps is None or scope["type"] not in {"http", "websocket"}:
        return False
    return apps.covers(_header_map(scope).get("host", ""))


async def apps_application(scope: Message, receive: Receive, send: Send) -> None:
    apps: AppsOrigin | None = settings.APPS
    headers = _header_map(scope)
    label = apps.label_of(headers.get("host", "")) if apps is not None else None
    if apps is None or label is None:
        await _refuse(scope, receive, send, 404, pages.no_such_app())
        return
    if apps.secure and scope.get("scheme") in {"http", "ws"}:
        await _to_https(scope, receive, send, apps.origin(label))
        return
    if scope["type"] == "http" and scope["path"] == ENTER_PATH:
        await _enter(scope, send, apps, label)
        return
    app_pass = _pass_of(scope, apps, label)
    if app_pass is None:
        await _refuse(scope, receive, send, 403, pages.no_pass())
        return
    checked = await _check(app_pass)
    if checked.refusal is not None:
        await _refuse(scope, receive, send, 403, pages.refused(f"This app is closed: {checked.refusal}."))
        return
    if not _same_origin(scope, headers, apps.origin(label)):
        await _refuse(scope, receive, send, 403, pages.refused("Requests to this app must come from its own pages."))
        return
    await _forward(scope, receive, send, apps, app_pass, checked)


async def _forward(
    scope: Message, receive: Receive, send: Send, apps: AppsOrigin, app_pass: AppPass, checked: Checked
) -> None:
    target = Target(
        key=(app_pass.label, app_pass.user_id),
        opener=_relay_opener(app_pass),
        label=app_pass.says,
        reserved_cookies=PASS_COOKIES,
    )
    forwarded = {
        "X-Forwarded-Proto": apps.scheme,
        "X-Forwarded-Host": _header_map(scope).get("host", ""),
        "X-Forwarded-For": scope_ip(scope),
        **checked.headers,
    }
    dropped = PASS_COOKIES | {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    headers = request_headers(scope, drop_cookies=dropped, extra=forwarded, drop=CLIENT_CLAIMS)
    if scope["type"] == "websocket":
        await forward_websocket(target, scope=scope, receive=receive, send=send, headers=headers)
    else:
        await forward_http(pool, target, scope=scope, receive=receive, send=send, headers=headers)


# --- the pass --------------------------------------------------------------------


async def _enter(scope: Message, send: Send, apps: AppsOrigin, label: str) -> None:
    code = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("code", [""])[0]
    redeemed = await database_sync_to_async(passes.code_redeem)(code=code, label=label)
    if redeemed is None:
        await pages.send_page(send, 403, pages.code_spent(passes.CODE_SECONDS))
        return
    value = passes.pass_seal(redeemed.app_pass)
    max_age = max(0, redeemed.app_pass.expires_at - int(time.time()))
    cookie = f"{cookie_name(apps)}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax"
    if apps.secure:
        cookie += "; Secure"
    await send(
        {
            "type": "http.response.start",
            "status": 302,
            "headers": [
                (b"location", redeemed.path.encode()),
                (b"set-cookie", cookie.encode()),
                (b"cache-control", b"no-store"),
                (b"referrer-policy", b"no-referrer"),
                (b"content-length", b"0"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def _pass_of(scope: Message, apps: AppsOrigin, label: str) -> AppPass | None:
    """The one pass for this app among the request's cookies of the pass's
    name. Two that unseal (a page's script may add one under a narrower
    path, which the browser sends first) are refused: neither is trusted."""
    name = cookie_name(apps)
    found: dict[str, AppPass] = {}
    for header, value in scope.get("headers", []):
        if header.lower() != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            key, _, sealed = part.strip().partition("=")
            app_pass = passes.pass_unseal(sealed, label=label) if key == name else None
            if app_pass is not None:
                found[json.dumps(asdict(app_pass), sort_keys=True)] = app_pass
    return next(iter(found.values())) if len(found) == 1 else None


async def _check(app_pass: AppPass) -> Checked:
    """``passes.pass_check``, remembered for ``CHECK_SECONDS`` in this process."""
    key = hashlib.sha256(json.dumps(asdict(app_pass)).encode()).hexdigest()
    now = time.monotonic()
    hit = _checked.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]
    checked = await database_sync_to_async(passes.pass_check)(app_pass)
    if len(_checked) >= _MAX_CHECKED:
        _checked.clear()
    _checked[key] = (now + CHECK_SECONDS, checked)
    return checked


def _relay_opener(app_pass: AppPass) -> StreamOpener:
    @asynccontextmanager
    async def opener() -> AsyncIterator[ByteStream]:
        session = await database_sync_to_async(passes.fresh_session)(app_pass)
        if session is None:
            try:
                session = await database_sync_to_async(passes.stream_grant)(app_pass)
            except AccessRefused as refused:
                raise Unavailable(refused.status_code, refused.message) from None
        async with open_job_stream(session) as stream:
            yield stream

    return opener


# --- requests ------------------------------------------------------------------


def _same_origin(scope: Message, headers: dict[str, str], origin: str) -> bool:
    """A websocket, or a request that may change state, from the app's own origin (or no browser's)."""
    sent = headers.get("origin")
    if scope["type"] == "websocket":
        return sent == origin
    return scope["method"] in SAFE_METHODS or sent is None or sent == origin


async def _to_https(scope: Message, receive: Receive, send: Send, origin: str) -> None:
    """An HTTPS app asked for over plain HTTP: the same address over HTTPS (a websocket is refused)."""
    if scope["type"] == "websocket":
        await _refuse(scope, receive, send, 403, pages.no_pass())
        return
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    location = origin.encode() + target
    headers = [(b"location", location), (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 308, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _refuse(scope: Message, receive: Receive, send: Send, status: int, page: pages.Page) -> None:
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008})
        return
    await pages.send_page(send, status, page)


def _header_map(scope: Message) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}

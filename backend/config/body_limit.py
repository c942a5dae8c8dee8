"""ASGI: cap every request body, per route, before it is read.

Django's ASGI handler reads a request's whole body (into a temporary file
past 2.5 MB) before any view runs, so a view's own checks come after the
bytes are on our disk. This middleware, in front of Django, decides first,
for every request, signed in or not. Each route has a cap (``route_cap``):

1. A PUT to a signed storage link (``/storage/<token>``): the size the link
   was signed for (the token is checked here: 403 for a bad or expired one).
2. ``…/blobs/`` (code archives and patches): TRAINYARD_MAX_BLOB_BYTES.
3. Run submissions and plans (``…/runs/``, ``…/runs/plan/``: workflow files
   inline) and a runner's file manifests (``api/v1/runner/jobs/<job>/``
   ``artifacts/``, ``checkpoints/``, ``caches/``, ``artifacts/<id>/parts/``):
   TRAINYARD_MAX_MANIFEST_BODY_BYTES.
4. Every other route: TRAINYARD_MAX_BODY_BYTES.

A Content-Length above the cap is refused with 413 before a byte of the body
is read; a chunked body (or one longer than it said) is cut off once it
passes the cap: 413, and Django is told the client went away, so it never
spools more than the cap. On top of that, a body above
TRAINYARD_UNAUTHENTICATED_BODY_BYTES (or of unknown length) must carry a
valid credential (an API token, a runner token or a signed-in session);
without one the smaller cap applies.

Errors use the API's one format: ``{"message": ..., "extra": {...}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.sessions.backends.base import SessionBase
from django.core import signing
from django.utils.module_loading import import_string

from backend.accounts.auth import token_from_header
from backend.accounts.selectors import user_for_token
from backend.artifacts.storage import verify_token
from backend.artifacts.views import put_size_refusal
from backend.clouds.services.instances import instance_for_token

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
STORAGE_PREFIX = "/storage/"
_BLOBS = re.compile(r"/api/v1/workspaces/[^/]+/blobs/")
_MANIFESTS = re.compile(
    r"/api/v1/workspaces/[^/]+/runs/(?:plan/)?"
    r"|/api/v1/runner/jobs/[^/]+/(?:artifacts|checkpoints|caches)/"
    r"|/api/v1/runner/jobs/[^/]+/artifacts/[^/]+/parts/"
)


class BodyLimit:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        length = headers.get("content-length", "")
        if not length.isdigit() and "transfer-encoding" not in headers:  # no body
            await self.app(scope, receive, send)
            return
        declared = int(length) if length.isdigit() else None
        if scope["path"].startswith(STORAGE_PREFIX) and scope["method"] == "PUT":
            refusal, cap = _storage_put(scope["path"][len(STORAGE_PREFIX) :], length)
        else:
            refusal, cap = await _other(scope["path"], headers, declared)
        if refusal is not None:
            await _answer(send, *refusal)
            return
        await self.app(scope, receive if cap is None else _capped(receive, send, cap), send)


def route_cap(path: str) -> int:
    """The most bytes a request body to ``path`` may have (but a storage PUT's)."""
    limits = settings.TRAINYARD
    if _BLOBS.fullmatch(path):
        return int(limits["MAX_BLOB_BYTES"])
    if _MANIFESTS.fullmatch(path):
        return int(limits["MAX_MANIFEST_BODY_BYTES"])
    return int(limits["MAX_BODY_BYTES"])


Refusal = tuple[int, str, dict[str, object]]


def _storage_put(token: str, length: str) -> tuple[Refusal | None, int | None]:
    try:
        signed = verify_token(token)
    except signing.SignatureExpired:
        return (403, "This link has expired: ask for a new one.", {}), None
    except signing.BadSignature:
        return (403, "This link is not valid.", {}), None
    if signed.method != "PUT":
        return (405, f"This link allows {signed.method} only.", {}), None
    if not signed.sha256:  # blobs: written by the server itself, never through a link
        return (403, "This link is not valid for an upload.", {}), None
    too_large = put_size_refusal(signed, length)
    if too_large:
        return (413, too_large, {"limit_bytes": signed.size}), None
    return None, signed.size


async def _other(path: str, headers: dict[str, str], declared: int | None) -> tuple[Refusal | None, int | None]:
    cap = route_cap(path)
    if declared is not None and declared > cap:
        return _too_large(declared, cap), None
    anonymous = settings.TRAINYARD["UNAUTHENTICATED_BODY_BYTES"]
    if anonymous >= cap or (declared is not None and declared <= anonymous):
        return None, cap
    # database_sync_to_async: the connection goes back (to the pool) after the check.
    if await database_sync_to_async(_has_valid_credential)(headers):
        return None, cap
    if declared is not None:
        return _unauthenticated(anonymous), None
    return None, anonymous


def _too_large(declared: int, cap: int) -> Refusal:
    return (
        413,
        f"The request body declares {declared:,} bytes; this endpoint takes {cap:,} at most.",
        {"limit_bytes": cap},
    )


def _unauthenticated(limit: int) -> Refusal:
    return (
        413,
        f"A request without a valid API token, runner token or session may send at most {limit:,} bytes: "
        "sign in or pass your token (Authorization: Bearer …).",
        {"limit_bytes": limit},
    )


def _has_valid_credential(headers: dict[str, str]) -> bool:
    token = token_from_header(headers.get("authorization", ""))
    if token is not None:
        return user_for_token(token=token) is not None or instance_for_token(token=token) is not None
    session_key = _cookies(headers.get("cookie", "")).get(settings.SESSION_COOKIE_NAME, "")
    if not session_key:
        return False
    store: SessionBase = import_string(settings.SESSION_ENGINE + ".SessionStore")(session_key)
    return bool(store.load().get("_auth_user_id"))


def _capped(receive: Receive, send: Send, cap: int) -> Receive:
    """``receive`` that answers 413 itself and tells Django the client went
    away (it then sends nothing) once the body passes ``cap`` bytes."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > cap:
                refusal = f"The request body is larger than the {cap:,} bytes this endpoint takes."
                await _answer(send, 413, refusal, {"limit_bytes": cap})
                return {"type": "http.disconnect"}
        return message

    return wrapped


async def _answer(send: Send, status: int, message: str, extra: dict[str, object]) -> None:
    body = json.dumps({"message": message, "extra": extra}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the body we did not read is not read on this connection either
        (b"x-content-type-options", b"nosniff"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _cookies(header: str) -> dict[str, str]:
    out = {}
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name:
            out[name] = value
    return out

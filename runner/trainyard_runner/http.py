"""Small blocking HTTP helpers on ``urllib.request``; every call has a timeout.

Callers run them in a thread (``asyncio.to_thread``). ``HttpError.recoverable``
tells a network problem or a 5xx (worth retrying) from a refusal (4xx).

``download``, ``open_get`` and ``put_file`` take signed URLs, whose path or
query is a credential (the server's ``/storage/<token>``, a presigned S3
query): their errors name only the URL's origin, so a job's reason never
hands out the link. ``post_json`` and ``get_json`` errors name the API path.

A call that carries the runner's token never follows a redirect
(``_TokenStaysHere``): urllib would resend the ``Authorization`` header to
wherever a redirect points, another origin included. Nor is it sent to any
origin but the pinned one (``pin_token_origin``: the server the runner
connected to, or ``--api-origin``), whatever URL an assignment names.
"""

from __future__ import annotations

import http.client
import io
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TIMEOUT = 30.0


class _TokenStaysHere(urllib.request.HTTPRedirectHandler):
    """Refuses to follow a redirect of a request with an ``Authorization``
    header; other requests (signed URLs, which carry no header) follow them."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if req.has_header("Authorization"):
            where = urlsplit(newurl).netloc or "another path"
            said = f"redirected to {where}: a call carrying the runner's token does not follow redirects"
            body = io.BytesIO(json.dumps({"message": said}).encode())
            raise urllib.error.HTTPError(req.full_url, code, said, headers, body)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_TokenStaysHere)

# The one origin a call carrying the runner's token may go to; "" until the
# agent pins it (the functions used on their own, as tools and tests do).
_token_origin = ""


def pin_token_origin(url: str) -> str:
    """From now on, send the runner's token only to ``url``'s origin
    (``ws``/``wss`` taken as ``http``/``https``); returns that origin."""
    global _token_origin
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) or ws(s) URL: {url!r}")
    _token_origin = f"{scheme}://{parts.netloc}"
    return _token_origin


class HttpError(Exception):
    def __init__(self, message: str, *, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail  # the answer's body (its first 2,000 bytes), "" without one

    @property
    def server_message(self) -> str:
        """The ``message`` of the server's ``{"message": …, "extra": …}``
        answer, else the whole error."""
        try:
            message = json.loads(self.detail).get("message")
        except (ValueError, AttributeError):
            message = None
        return message if isinstance(message, str) and message else str(self)

    @property
    def recoverable(self) -> bool:
        return self.status is None or self.status >= 500 or self.status == 429


def download(url: str, dest: Path, *, timeout: float = TIMEOUT) -> None:
    """GET ``url`` into the file ``dest``."""
    with _open(urllib.request.Request(url), timeout, signed=True) as resp, dest.open("wb") as f:
        shutil.copyfileobj(resp, f, 1 << 20)
        expected = resp.headers.get("Content-Length")
    # A cut connection can end the body early without an error, and git
    # apply silently skips a truncated binary hunk: check the length.
    if expected is not None and dest.stat().st_size != int(expected):
        raise HttpError(f"GET {_shown(url, signed=True)}: got {dest.stat().st_size} of {expected} bytes")


def open_get(url: str, *, headers: dict[str, str] | None = None, timeout: float = TIMEOUT) -> Any:
    """GET ``url`` and return the open response (read it in chunks, then close
    it); ``timeout`` applies to every socket operation."""
    return _open(urllib.request.Request(url, headers=headers or {}), timeout, signed=True)


def post_json(url: str, body: dict[str, Any], *, token: str, timeout: float = TIMEOUT) -> Any:
    """POST JSON with the bearer token; returns the decoded JSON answer (or None)."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with _open(req, timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def get_json(url: str, *, token: str, timeout: float = TIMEOUT) -> Any:
    """GET with the bearer token; returns the decoded JSON answer."""
    req = urllib.request.Request(url, headers={"Accept": "application/json", "Authorization": f"Bearer {token}"})
    with _open(req, timeout) as resp:
        return json.loads(resp.read())


def put_file(
    url: str, path: Path, *, headers: dict[str, str], timeout: float = TIMEOUT, offset: int = 0, length: int = -1
) -> str:
    """PUT the bytes of ``path`` (or ``length`` bytes from ``offset``: one
    part of a multipart upload) to ``url``, streamed from the file; returns
    the answer's ETag ("" if none)."""
    size = path.stat().st_size - offset if length < 0 else length
    with path.open("rb") as f:
        f.seek(offset)
        req = urllib.request.Request(
            url,
            data=_Slice(f, size) if size else b"",
            method="PUT",
            headers={**headers, "Content-Length": str(size), "Content-Type": "application/octet-stream"},
        )
        with _open(req, timeout, signed=True) as resp:
            resp.read()
            return str(resp.headers.get("ETag") or "")


class _Slice:
    """At most ``left`` bytes of an open file, read by http.client in blocks."""

    def __init__(self, f: Any, left: int) -> None:
        self._f = f
        self._left = left

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = bytes(self._f.read(n))
        self._left -= len(data)
        return data


def same_origin(a: str, b: str) -> bool:
    sa, sb = urlsplit(a), urlsplit(b)
    return (sa.scheme, sa.netloc) == (sb.scheme, sb.netloc)


def _open(req: urllib.request.Request, timeout: float, *, signed: bool = False) -> Any:
    shown = _shown(req.full_url, signed=signed)
    if _token_origin and req.has_header("Authorization") and not same_origin(req.full_url, _token_origin):
        raise HttpError(
            f"{req.get_method()} {shown}: refused here: the runner sends its token only to {_token_origin} "
            "(the server it connected to, or --api-origin), and this call names another origin",
            status=0,  # refused before anything was sent: not worth retrying
        )
    try:
        return _OPENER.open(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        detail = e.read(2000).decode("utf-8", errors="replace").strip()
        detail = _scrubbed(detail, req.full_url) if signed else detail
        said = _message(detail)[:500]
        raise HttpError(f"{req.get_method()} {shown}: HTTP {e.code} {said}", status=e.code, detail=detail) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        why = _scrubbed(str(e), req.full_url) if signed else str(e)
        raise HttpError(f"{req.get_method()} {shown}: {why}") from None


def _message(body: str) -> str:
    """The ``message`` of an answer in the API's error format
    (``{"message": ..., "extra": ...}``: a storage quota's 413 says how much is
    used and what to do), else the body as it is."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    message = data.get("message") if isinstance(data, dict) else None
    return message if isinstance(message, str) and message else body


def _shown(url: str, *, signed: bool) -> str:
    """The URL as messages show it: no query (a signature), no user:password,
    and for a signed URL not its path either (our storage's token is there)."""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    return f"{origin}/… (signed URL)" if signed else f"{origin}{parts.path}"


def _scrubbed(text: str, url: str) -> str:
    """``text`` (an error body, an exception) without the signed URL's path
    or query, which some servers and exceptions quote."""
    parts = urlsplit(url)
    for secret in (parts.query, parts.path):
        if len(secret) > 1:
            text = text.replace(secret, "…")
    return text

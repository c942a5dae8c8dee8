"""Small blocking HTTP helpers on ``urllib.request``; every call has a timeout.

Callers run them in a thread (``asyncio.to_thread``). ``HttpError.recoverable``
tells a network problem or a 5xx (worth retrying) from a refusal (4xx).
"""

from __future__ import annotations

import http.client
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TIMEOUT = 30.0


class HttpError(Exception):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def recoverable(self) -> bool:
        return self.status is None or self.status >= 500 or self.status == 429


def download(url: str, dest: Path, *, timeout: float = TIMEOUT) -> None:
    """GET ``url`` into the file ``dest``."""
    with _open(urllib.request.Request(url), timeout) as resp, dest.open("wb") as f:
        shutil.copyfileobj(resp, f, 1 << 20)
        expected = resp.headers.get("Content-Length")
    # A cut connection can end the body early without an error, and git
    # apply silently skips a truncated binary hunk: check the length.
    if expected is not None and dest.stat().st_size != int(expected):
        raise HttpError(f"GET {_short(url)}: got {dest.stat().st_size} of {expected} bytes")


def open_get(url: str, *, headers: dict[str, str] | None = None, timeout: float = TIMEOUT) -> Any:
    """GET ``url`` and return the open response (read it in chunks, then close
    it); ``timeout`` applies to every socket operation."""
    return _open(urllib.request.Request(url, headers=headers or {}), timeout)


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


def put_file(url: str, path: Path, *, headers: dict[str, str], timeout: float = TIMEOUT) -> None:
    """PUT the bytes of ``path`` to ``url``, streamed from the file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        req = urllib.request.Request(
            url,
            data=f if size else b"",
            method="PUT",
            headers={**headers, "Content-Length": str(size), "Content-Type": "application/octet-stream"},
        )
        with _open(req, timeout) as resp:
            resp.read()


def same_origin(a: str, b: str) -> bool:
    sa, sb = urlsplit(a), urlsplit(b)
    return (sa.scheme, sa.netloc) == (sb.scheme, sb.netloc)


def _open(req: urllib.request.Request, timeout: float) -> Any:
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        detail = e.read(500).decode("utf-8", errors="replace").strip()
        raise HttpError(f"{req.get_method()} {_short(req.full_url)}: HTTP {e.code} {detail}", status=e.code) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise HttpError(f"{req.get_method()} {_short(req.full_url)}: {e}") from None


def _short(url: str) -> str:
    # Signed URLs carry credentials in the query string: never log them.
    return url.split("?", 1)[0]

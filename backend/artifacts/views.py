"""/storage/<token>: the local storage's signed URLs (GET and PUT), and
/storage-archive/<token>: a zip of an artifact's files.

These serve files named and written by jobs, from the dashboard's origin. A
browser must never render one as a page there (an ``x.html`` artifact would
run with the signed-in user's cookies): every response is a download
(``attachment``, ``application/octet-stream``), is never sniffed for a type,
and is sandboxed should a browser render it anyway. The dashboard previews
files by reading their bytes (``fetch``), never by navigating to them.

Both stream with bounded memory. Under ASGI Django collects a synchronous
iterator whole before sending a byte (a 2 GiB file would sit in this
process's memory), so each body is an asynchronous iterator (``Stepped``)
that reads one block at a time in the request's own thread and is sent
block by block, at the pace the client reads (the ASGI server waits for
its socket to drain before taking the next block).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from functools import wraps
from typing import BinaryIO

from asgiref.sync import sync_to_async
from django.core import signing
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header
from django.views.decorators.csrf import csrf_exempt

from backend.artifacts.archive import archive_name, archive_token, zip_stream
from backend.artifacts.models import Artifact
from backend.artifacts.storage import (
    ChecksumMismatch,
    ObjectExists,
    SignedRequest,
    TooLarge,
    get_storage,
    verify_token,
)
from backend.core.ratelimit import client_ip, rate_hit
from backend.core.throttling import refusal_response

CHUNK = 1 << 20
DOWNLOAD_TYPE = "application/octet-stream"
DOWNLOAD_BLOCK = 1 << 20  # bytes per read of a file sent from the local storage


def _inert(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Every response of ``view``, errors included, is never sniffed for a
    type and, if a browser renders it anyway, runs in a sandbox (no script,
    no same-origin access)."""

    @wraps(view)
    def wrapped(request: HttpRequest, token: str) -> HttpResponseBase:
        response = view(request, token)
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "sandbox"
        return response

    return wrapped


@csrf_exempt
@_inert
def storage_object(request: HttpRequest, token: str) -> HttpResponseBase:
    try:
        signed = verify_token(token)
    except signing.SignatureExpired:
        return _error(403, "This link has expired: ask for a new one.")
    except signing.BadSignature:
        return _error(403, "This link is not valid.")
    key, method, filename = signed.key, signed.method, signed.filename
    if request.method != method:
        return _error(405, f"This link allows {method} only.")
    storage = get_storage()
    if method == "PUT":
        if not signed.sha256:  # blobs: written by the server itself, never through a link
            return _error(403, "This link is not valid for an upload.")
        declared = put_size_refusal(signed, request.META.get("CONTENT_LENGTH") or "")
        if declared:
            return _error(413, declared, {"limit_bytes": signed.size})
        try:
            size = storage.write_checked(key, _body(request), sha256=signed.sha256, size=signed.size)
        except TooLarge as e:
            return _error(413, f"The upload is too large: {e}.", {"limit_bytes": signed.size})
        except ChecksumMismatch as e:
            return _error(400, f"The uploaded bytes are not the file this link is for ({e}).")
        except ObjectExists:
            return _error(409, "This object is already stored: a finished upload cannot be changed.")
        return JsonResponse({"size": size}, status=201)
    try:
        handle = storage.open(key)
    except FileNotFoundError:
        return _error(404, "Not found.")
    name = filename or key.rsplit("/", 1)[-1]
    total = os.fstat(handle.fileno()).st_size
    try:
        wanted = _byte_range(request.headers.get("Range", ""), total)
    except RangeNotSatisfiable:
        handle.close()
        refused = _error(416, f"This file has {total} bytes: the range asked for starts past its end.")
        refused["Content-Range"] = f"bytes */{total}"
        return refused
    start, end = wanted or (0, total)
    handle.seek(start)
    response = StreamingHttpResponse(Stepped(Blocks(handle, end - start)), content_type=DOWNLOAD_TYPE)
    if wanted:
        response.status_code = 206
        response["Content-Range"] = f"bytes {start}-{end - 1}/{total}"
    response["Content-Length"] = str(end - start)
    response["Accept-Ranges"] = "bytes"
    response["Content-Disposition"] = content_disposition_header(True, name)
    return response


class RangeNotSatisfiable(Exception):
    """A ``Range`` that starts past the end of the file."""


def _byte_range(header: str, total: int) -> tuple[int, int] | None:
    """The part of a file of ``total`` bytes that a ``Range: bytes=`` header
    asks for, as [start, end); None for the whole file (no header, or one
    this does not serve: several ranges, other units); RangeNotSatisfiable
    when it starts past the end. A resumed download asks ``bytes=N-``."""
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not (first.isdigit() or (not first and last.isdigit())):
        return None
    if not first:  # the last N bytes
        start = max(total - int(last), 0)
        if not total:
            raise RangeNotSatisfiable
        return start, total
    start = int(first)
    if start >= total:
        raise RangeNotSatisfiable
    end = min(int(last) + 1, total) if last.isdigit() else total
    return (start, end) if end > start else None


@_inert
def storage_archive(request: HttpRequest, token: str) -> HttpResponseBase:
    # Each opening zips again: a link may be opened again until it expires,
    # so openings are counted per address as the API counts archives per user.
    refusal = rate_hit(scope="archive", kind="ip", identity=client_ip(request))
    if refusal is not None:
        return refusal_response(refusal)
    try:
        artifact_id, prefix = archive_token(token)
    except signing.SignatureExpired:
        return _error(403, "This link has expired: ask for a new one.")
    except signing.BadSignature:
        return _error(403, "This link is not valid.")
    artifact = Artifact.objects.filter(pk=artifact_id).first()
    if artifact is None:
        return _error(404, "Not found.")
    response = StreamingHttpResponse(Stepped(zip_stream(artifact, prefix)), content_type=DOWNLOAD_TYPE)
    response["Content-Disposition"] = content_disposition_header(True, archive_name(artifact, prefix))
    return response


class Stepped:
    """A response body that steps a synchronous iterator of bytes (which may
    read files, S3 or the database) in the request's own thread, one step at
    a time: an asynchronous iterator, so Django sends each block as it comes
    instead of collecting the whole body first. Django calls ``close`` once
    the response is over (sent, or the client went away), in that same
    thread: the source's files are closed then, not at garbage collection."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        step = sync_to_async(_next_or_none)
        while (chunk := await step(self._chunks)) is not None:
            if chunk:
                yield chunk

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def _next_or_none(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


class Blocks:
    """An open file read in ``DOWNLOAD_BLOCK``s (Django's 4 KiB cost a send
    per block: a 118 MB log ran at half the speed), at most ``limit`` bytes
    from where it stands; closed at its end or by ``close``."""

    def __init__(self, handle: BinaryIO, limit: int | None = None) -> None:
        self._handle = handle
        self._left = limit

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        size = DOWNLOAD_BLOCK if self._left is None else min(DOWNLOAD_BLOCK, self._left)
        block = self._handle.read(size) if size else b""
        if self._left is not None:
            self._left -= len(block)
        if not block:
            self.close()
            raise StopIteration
        return block

    def close(self) -> None:
        self._handle.close()


def _body(request: HttpRequest) -> Iterator[bytes]:
    # read() streams; request.body would hold the whole file in memory and
    # trip DATA_UPLOAD_MAX_MEMORY_SIZE.
    while chunk := request.read(CHUNK):
        yield chunk


def put_size_refusal(signed: SignedRequest, content_length: str) -> str:
    """Why a PUT declaring ``content_length`` is refused before its body is
    read ("" if it is not): more bytes than its link was signed for."""
    if signed.size is None or not content_length.isdigit() or int(content_length) <= signed.size:
        return ""
    return f"The upload declares {int(content_length):,} bytes; this link takes {signed.size:,} at most."


def _error(status: int, message: str, extra: dict[str, object] | None = None) -> JsonResponse:
    return JsonResponse({"message": message, "extra": extra or {}}, status=status)

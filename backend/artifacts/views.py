"""/storage/<token>: the local storage's signed URLs (GET and PUT), and
/storage-archive/<token>: a zip of an artifact's files.

These serve files named and written by jobs, from the dashboard's origin. A
browser must never render one as a page there (an ``x.html`` artifact would
run with the signed-in user's cookies): every response is a download
(``attachment``, ``application/octet-stream``), is never sniffed for a type,
and is sandboxed should a browser render it anyway. The dashboard previews
files by reading their bytes (``fetch``), never by navigating to them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import wraps

from django.core import signing
from django.http import FileResponse, HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
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
    response = FileResponse(handle, as_attachment=True, filename=name, content_type=DOWNLOAD_TYPE)
    response.block_size = DOWNLOAD_BLOCK  # Django's 4 KiB costs a send per block: a 118 MB log ran at half the speed
    return response


@_inert
def storage_archive(request: HttpRequest, token: str) -> HttpResponseBase:
    try:
        artifact_id, prefix = archive_token(token)
    except signing.SignatureExpired:
        return _error(403, "This link has expired: ask for a new one.")
    except signing.BadSignature:
        return _error(403, "This link is not valid.")
    artifact = Artifact.objects.filter(pk=artifact_id).first()
    if artifact is None:
        return _error(404, "Not found.")
    response = StreamingHttpResponse(zip_stream(artifact, prefix), content_type=DOWNLOAD_TYPE)
    response["Content-Disposition"] = content_disposition_header(True, archive_name(artifact, prefix))
    return response


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

"""/storage/<token>: the local storage's signed URLs (GET and PUT)."""

from __future__ import annotations

from collections.abc import Iterator

from django.core import signing
from django.http import FileResponse, HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from backend.artifacts.archive import archive_name, archive_token, zip_stream
from backend.artifacts.models import Artifact
from backend.artifacts.storage import get_storage, verify_token

CHUNK = 1 << 20


@csrf_exempt
def storage_object(request: HttpRequest, token: str) -> HttpResponseBase:
    try:
        key, method, filename = verify_token(token)
    except signing.SignatureExpired:
        return _error(403, "This link has expired: ask for a new one.")
    except signing.BadSignature:
        return _error(403, "This link is not valid.")
    if request.method != method:
        return _error(405, f"This link allows {method} only.")
    storage = get_storage()
    if method == "PUT":
        size = storage.write(key, _body(request))
        return JsonResponse({"size": size}, status=201)
    try:
        handle = storage.open(key)
    except FileNotFoundError:
        return _error(404, "Not found.")
    return FileResponse(handle, as_attachment=bool(filename), filename=filename)


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
    response = StreamingHttpResponse(zip_stream(artifact, prefix), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{archive_name(artifact, prefix)}"'
    return response


def _body(request: HttpRequest) -> Iterator[bytes]:
    # read() streams; request.body would hold the whole file in memory and
    # trip DATA_UPLOAD_MAX_MEMORY_SIZE.
    while chunk := request.read(CHUNK):
        yield chunk


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"message": message, "extra": {}}, status=status)

"""Zip archives of an artifact (or a folder of it), streamed, never stored.

The API answers with a short-lived signed URL (like single files); the URL's
view streams a zip built on the fly from storage (stored, not deflated: model
files do not compress and CPU is better spent elsewhere). From an S3 bucket
the bytes pass through this server (S3 cannot zip).

``zip_stream`` yields the zip a block at a time; the view steps it from an
asynchronous iterator (backend/artifacts/views.py, ``Stepped``), so at most
a block or two of it is in memory however large the files are. Each entry
is written with its size known, so a file over 2 GiB gets its ZIP64 fields.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator

from django.conf import settings
from django.core import signing

from backend.artifacts.locations import storage_of
from backend.artifacts.models import Artifact
from backend.artifacts.services import artifact_file_key

_SALT = "trainyard.archive"
ARCHIVE_URL_SECONDS = 300


def archive_url(*, artifact: Artifact, prefix: str) -> str:
    token = signing.dumps({"a": str(artifact.pk), "p": prefix}, salt=_SALT, compress=True)
    return f"{settings.PUBLIC_URL}/storage-archive/{token}"


def archive_token(token: str) -> tuple[str, str]:
    """(artifact id, prefix); raises signing.BadSignature / SignatureExpired."""
    data = signing.loads(token, salt=_SALT, max_age=ARCHIVE_URL_SECONDS)
    return data["a"], data["p"]


def archive_name(artifact: Artifact, prefix: str) -> str:
    base = (prefix.rstrip("/").rsplit("/", 1)[-1] or artifact.path.strip("./").replace("/", "-")) or "artifact"
    return f"{base}.zip"


BLOCK = 1 << 20  # bytes read from storage at a time


def zip_stream(artifact: Artifact, prefix: str) -> Iterator[bytes]:
    sink = _Chunks()
    storage = storage_of(artifact)
    with zipfile.ZipFile(sink, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for file in artifact.files.filter(path__startswith=prefix).order_by("path").iterator():
            entry = zipfile.ZipInfo(file.path)
            entry.compress_type = zipfile.ZIP_STORED
            entry.file_size = file.size  # ZipFile picks ZIP64 fields from it (above 2 GiB)
            with storage.open(artifact_file_key(artifact, file)) as src, archive.open(entry, "w") as dst:
                while chunk := src.read(BLOCK):
                    dst.write(chunk)
                    yield from sink.drain()
        # closing writes the central directory
    yield from sink.drain()


class _Chunks:
    """A write-only, non-seekable file that hands out what was written."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        return None

    def close(self) -> None:  # ZipFile never closes a file it was given; the protocol still asks for it
        return None

    def drain(self) -> Iterator[bytes]:
        parts, self._parts = self._parts, []
        yield from parts

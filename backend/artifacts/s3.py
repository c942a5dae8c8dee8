"""A workspace's own S3 bucket behind the ``Storage`` interface.

Keys: ``trainyard/<workspace>/…`` then the same layout as local storage
(``runs/<run>/jobs/<job>/artifacts/<id>/<file>``, ``blobs/<id>``; room for
``runs/<run>/jobs/<job>/checkpoints/<attempt>/<n>/…``). URLs live at most
15 minutes and less than the signing credentials have left; clients ask for
fresh ones (docs/STORAGE.md). What ``verify`` checks is in
docs/decisions/0073-s3-upload-verification.md.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from typing import BinaryIO
from uuid import UUID

from django.conf import settings

from backend.artifacts.storage import Method, Part, Storage, Target
from backend.clouds.backends.aws import s3
from backend.clouds.backends.aws.session import AwsAuth


class S3Storage(Storage):
    multipart = True

    def __init__(self, *, account_id: UUID, auth: AwsAuth, bucket: str, region: str) -> None:
        self.account_id = account_id
        self.bucket = bucket
        self._s3 = s3.S3Bucket(auth, bucket=bucket, region=region)

    def key_root(self, workspace_id: object) -> str:
        return f"trainyard/{workspace_id}"

    def signed_url(self, key: str, *, method: Method, seconds: int | None = None, filename: str = "") -> str:
        lifetime = self._seconds(seconds)
        if method == "GET":
            return self._s3.presign_get(key, seconds=lifetime, filename=filename).url
        raise ValueError("S3 uploads are bound to their checksum: use upload_target or part_targets")

    def upload_target(self, key: str, *, sha256: str, size: int, seconds: int) -> Target:
        signed = self._s3.presign_put(key, seconds=self._seconds(seconds), sha256=sha256, size=size)
        return Target(signed.url, signed.headers, signed.seconds)

    def multipart_create(self, key: str) -> str:
        return self._s3.create_multipart(key)

    def part_targets(self, key: str, *, upload_id: str, parts: list[tuple[int, str, int]]) -> list[Target]:
        seconds = self._seconds(None)
        signed = [
            self._s3.presign_part(key, upload_id=upload_id, number=n, sha256=sha, size=size, seconds=seconds)
            for n, sha, size in parts
        ]
        return [Target(s.url, s.headers, s.seconds) for s in signed]

    def multipart_complete(self, key: str, *, upload_id: str, parts: list[Part]) -> None:
        self._s3.complete_multipart(
            key, upload_id=upload_id, parts=[s3.Part(number=p.number, etag=p.etag, sha256=p.sha256) for p in parts]
        )

    def multipart_abort(self, key: str, *, upload_id: str) -> None:
        self._s3.abort_multipart(key, upload_id=upload_id)

    def verify(self, key: str, *, size: int, sha256: str, part_sha256s: list[str]) -> str:
        head = self._s3.head(key)
        if head is None:
            return "missing"
        if head.size != size:
            return f"{head.size} bytes stored, {size} expected"
        expected = composite_checksum(part_sha256s) if part_sha256s else s3.b64_of_hex(sha256)
        stored, _, count = head.checksum_sha256.partition("-")
        if not stored:
            return "stored without a SHA-256 checksum"
        if stored != expected or (count and int(count) != len(part_sha256s)):
            return "SHA-256 checksum differs"
        return ""

    def delete(self, keys: list[str]) -> None:
        self._s3.delete(keys)

    def write(self, key: str, chunks: Iterator[bytes]) -> int:
        reader = _ChunkReader(chunks)
        self._s3.upload(key, reader)
        return reader.size

    def open(self, key: str) -> BinaryIO:
        return self._s3.open(key)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self._s3.read_range(key, start, end)

    def size(self, key: str) -> int | None:
        head = self._s3.head(key)
        return None if head is None else head.size

    def _seconds(self, wanted: int | None) -> int:
        limit = settings.TRAINYARD["S3_URL_SECONDS"]
        return min(wanted or limit, limit)


def composite_checksum(part_sha256s: list[str]) -> str:
    """S3's checksum of a multipart object: the SHA-256 of the parts'
    digests, base64 (S3 shows it followed by "-<number of parts>")."""
    joined = b"".join(bytes.fromhex(p) for p in part_sha256s)
    return base64.b64encode(hashlib.sha256(joined).digest()).decode()


class _ChunkReader:
    """A read-only file over an iterator of chunks (boto3 reads uploads from files)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""
        self.size = 0

    def read(self, n: int = -1, /) -> bytes:
        while n < 0 or len(self._buffer) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
            self.size += len(chunk)
        if n < 0:
            out, self._buffer = self._buffer, b""
        else:
            out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

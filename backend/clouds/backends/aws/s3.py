"""One S3 bucket of a connected account: presigned URLs, multipart uploads,
HeadObject. The only place that talks S3 (the cloud SDK stays in its backend); the storage layer
(backend/artifacts/s3.py) builds on it.

Presigned URLs die with the credentials that signed them: a role session's credentials live an hour
whatever ``ExpiresIn`` says, so every URL is capped below what is left of
them as well as at ``MAX_URL_SECONDS``.

Uploads carry S3's own SHA-256 checksum: a single PUT is presigned with the
file's ``x-amz-checksum-sha256`` (a signed header: the client must send it,
and S3 refuses a body that does not match it), a multipart upload is created
with ``ChecksumAlgorithm=SHA256`` and each part presigned with its own
checksum. Every PUT and part is presigned with its ``ContentLength`` too
(``content-length`` is then a signed header: S3 refuses a body of another
size, so a URL cannot store more than was declared). ``head`` reads the checksum S3 stored (``ChecksumMode=ENABLED``).
"""

from __future__ import annotations

import base64
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, cast
from urllib.parse import quote

from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

from backend.clouds.backends.aws.session import CONNECT_TIMEOUT, READ_TIMEOUT, AwsAuth, session_for

MAX_URL_SECONDS = 900
# A URL is never issued for less than this: what is left of a role's
# credentials is at least botocore's mandatory refresh window (10 min), so
# this floor is only reached with credentials that are about to be renewed.
MIN_URL_SECONDS = 60
CREDENTIALS_MARGIN = 30
_CONFIG = Config(
    signature_version="s3v4",
    connect_timeout=CONNECT_TIMEOUT,
    read_timeout=READ_TIMEOUT,
    retries={"mode": "standard", "max_attempts": 3},
)
_lock = threading.Lock()
# Per session (forgotten with it, see session.forget_sessions) and region.
_clients: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Signed:
    """A presigned request: the URL and the headers the client must send."""

    url: str
    headers: dict[str, str]
    seconds: int


@dataclass(frozen=True)
class Head:
    size: int
    checksum_sha256: str  # base64, as S3 stores it ("…=-N" for a multipart object); "" if none


@dataclass(frozen=True)
class Part:
    number: int
    etag: str
    sha256: str  # hex


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def b64_of_hex(hex_digest: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


class S3Bucket:
    def __init__(self, auth: AwsAuth, *, bucket: str, region: str) -> None:
        self.auth = auth
        self.bucket = bucket
        self.region = region

    def presign_get(self, key: str, *, seconds: int, filename: str) -> Signed:
        """A GET that always downloads (never renders) as ``filename``."""
        params = {
            "ResponseContentDisposition": _attachment(filename or key.rsplit("/", 1)[-1]),
            "ResponseContentType": "application/octet-stream",
        }
        return self._presign("get_object", key, seconds, params, {})

    def presign_put(self, key: str, *, seconds: int, sha256: str, size: int) -> Signed:
        checksum = b64_of_hex(sha256)
        params = {"ChecksumAlgorithm": "SHA256", "ChecksumSHA256": checksum, "ContentLength": size}
        headers = {"x-amz-checksum-sha256": checksum, "x-amz-sdk-checksum-algorithm": "SHA256"}
        return self._presign("put_object", key, seconds, params, headers)

    def presign_part(self, key: str, *, upload_id: str, number: int, sha256: str, size: int, seconds: int) -> Signed:
        checksum = b64_of_hex(sha256)
        params = {"UploadId": upload_id, "PartNumber": number, "ChecksumSHA256": checksum, "ContentLength": size}
        return self._presign("upload_part", key, seconds, params, {"x-amz-checksum-sha256": checksum})

    def create_multipart(self, key: str) -> str:
        answer = self._s3().create_multipart_upload(
            Bucket=self.bucket, Key=key, ChecksumAlgorithm="SHA256", ContentType="application/octet-stream"
        )
        return str(answer["UploadId"])

    def complete_multipart(self, key: str, *, upload_id: str, parts: list[Part]) -> None:
        """Idempotent: an upload completed before (a retried request) is
        accepted as long as the object is there; ``head`` checks it."""
        body = [{"PartNumber": p.number, "ETag": p.etag, "ChecksumSHA256": b64_of_hex(p.sha256)} for p in parts]
        try:
            self._s3().complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": body}
            )
        except ClientError as e:
            if _code(e) != "NoSuchUpload" or self.head(key) is None:
                raise

    def abort_multipart(self, key: str, *, upload_id: str) -> None:
        try:
            self._s3().abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as e:
            if _code(e) != "NoSuchUpload":
                raise

    def delete(self, keys: list[str]) -> None:
        """Delete the objects (a missing one is no error), 1,000 per request."""
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            answer = self._s3().delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            errors = answer.get("Errors") or []
            if errors:
                first = errors[0]
                raise RuntimeError(
                    f"S3 refused to delete {len(errors)} object(s), e.g. {first.get('Key')}: {first.get('Message')}"
                )

    def head(self, key: str) -> Head | None:
        try:
            answer = self._s3().head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return Head(size=int(answer["ContentLength"]), checksum_sha256=str(answer.get("ChecksumSHA256") or ""))

    def open(self, key: str) -> BinaryIO:
        """The object's bytes, streamed; FileNotFoundError if there is none."""
        try:
            answer = self._s3().get_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if _code(e) in ("404", "NoSuchKey"):
                raise FileNotFoundError(key) from None
            raise
        return cast(BinaryIO, answer["Body"])

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` .. ``end`` - 1 of the object (one ranged GET)."""
        if end <= start:
            return b""
        try:
            answer = self._s3().get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}")
        except ClientError as e:
            if _code(e) in ("404", "NoSuchKey"):
                raise FileNotFoundError(key) from None
            raise
        return bytes(answer["Body"].read())

    def upload(self, key: str, source: Readable) -> None:
        """Stream ``source`` into the object (boto3 goes multipart by itself
        for large ones); the object appears only when it is whole."""
        self._s3().upload_fileobj(source, self.bucket, key, ExtraArgs={"ContentType": "application/octet-stream"})

    def url_seconds(self, wanted: int) -> int:
        """``wanted`` capped at MAX_URL_SECONDS and below the remaining
        lifetime of the credentials that will sign it."""
        seconds = min(wanted, MAX_URL_SECONDS)
        left = self._credentials_left()
        if left is not None:
            seconds = min(seconds, max(int(left) - CREDENTIALS_MARGIN, MIN_URL_SECONDS))
        return max(seconds, 1)

    def _presign(
        self, operation: str, key: str, seconds: int, params: dict[str, Any], headers: dict[str, str]
    ) -> Signed:
        lifetime = self.url_seconds(seconds)
        url = self._s3().generate_presigned_url(
            operation, Params={"Bucket": self.bucket, "Key": key, **params}, ExpiresIn=lifetime
        )
        return Signed(url=str(url), headers=headers, seconds=lifetime)

    def _credentials_left(self) -> float | None:
        credentials = session_for(self.auth).get_credentials()
        # Refreshable (role) credentials renew themselves when read; static keys never expire.
        if credentials is None or not hasattr(credentials, "get_frozen_credentials"):
            return None
        credentials.get_frozen_credentials()
        expiry = getattr(credentials, "_expiry_time", None)
        if expiry is None:
            return None
        return float(expiry.timestamp() - time.time())

    def _s3(self) -> Any:
        # Clients are thread-safe and costly to build: one per credentials and region.
        session = session_for(self.auth)
        with _lock:
            found = _clients.setdefault(session, {}).get(self.region)
        if found is None:
            found = session.client("s3", region_name=self.region, config=_CONFIG)
            with _lock:
                found = _clients[session].setdefault(self.region, found)
        return found


def _attachment(name: str) -> str:
    ascii_name = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


# ------------------------------------------------------------ copies between buckets
#
# With a client the caller got for the destination (backend.data.sources.s3_access):
# one CopyObject up to S3's 5 GB limit for a single copy, boto3's managed copy
# in parts (UploadPartCopy) above it; the bytes never leave S3.
COPY_SINGLE_LIMIT = 5 * 1024**3
COPY_PART_SIZE = 256 * 1024**2


def readable(client: Any, *, bucket: str, key: str) -> bool:
    """Whether ``client``'s credentials may read the object (HeadObject):
    what a server-side copy from it needs (s3:GetObject on the source)."""
    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError:
        return False
    return True


def copy_within_s3(client: Any, *, source_bucket: str, source_key: str, bucket: str, key: str) -> None:
    """Copy one object server-side, in parts above ``COPY_SINGLE_LIMIT``."""
    config = TransferConfig(multipart_threshold=COPY_SINGLE_LIMIT, multipart_chunksize=COPY_PART_SIZE)
    client.copy({"Bucket": source_bucket, "Key": source_key}, bucket, key, Config=config)


def upload_to(client: Any, *, bucket: str, key: str, source: Readable) -> None:
    """Stream ``source`` into ``bucket``/``key`` (boto3 goes multipart by
    itself for large ones; an unfinished upload is aborted on failure)."""
    client.upload_fileobj(source, bucket, key, ExtraArgs={"ContentType": "application/octet-stream"})

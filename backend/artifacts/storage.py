"""Object storage behind one small interface: local files (the embedded
default) or a workspace's own S3 bucket (backend/artifacts/s3.py).

Runners and the CLI never stream bytes through the API's websocket: they get
short-lived signed URLs (``signed_url``, ``upload_target``, ``part_targets``;
presigned S3 URLs in the S3 implementation) and PUT or GET the bytes directly.
The server checks an upload with ``verify`` and reads or writes bytes itself
(``open``, ``write``) only for code blobs and zip archives.
Which storage holds an object is recorded on it (backend/artifacts/locations.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO, Literal
from uuid import UUID

from django.conf import settings
from django.core import signing
from django.db import transaction

logger = logging.getLogger(__name__)

Method = Literal["GET", "PUT"]
_SALT = "trainyard.storage"
# Where a signed URL carries its credential: the token in the path of our own
# links (/storage/<token>, /storage-archive/<token>, also when an error quotes
# only the path; a token is 100+ characters of base64 and ":", ending in the
# signature), the query of any other URL (presigned S3 URLs). Neither takes
# the punctuation of the sentence around it.
#
# Both read text a runner sends (a job's reason) in time linear in its length
# (docs/decisions/0081-linear-redaction.md). A token's run of characters stops at
# the next "/", so the tries at each "/storage/" read disjoint runs. A URL's
# host and path run (``_URL``) is taken whole and possessively, its query
# only when there is one: a search for "a URL followed by a query" would
# retry at every "http://" inside a run without one (``http://http://…``),
# each try reading the rest of the run.
_TOKEN_IN_PATH = re.compile(r"(/storage(?:-archive)?/)[\w.:\-]{19,}[\w\-]")
_URL = re.compile(r"(https?://[^\s?#'\"<>]++)(\?[^\s#'\"<>]*[^\s#'\"<>:.,;!)])?")


@dataclass(frozen=True)
class Target:
    """Where a client sends one object (or one part of it): the URL, the
    headers it must send with it, and how long the URL lives."""

    url: str
    headers: dict[str, str]
    seconds: int


@dataclass(frozen=True)
class Part:
    number: int  # 1-based
    etag: str
    sha256: str  # hex


class Storage(ABC):
    # Where objects of this storage live, as recorded on Blob and Artifact rows.
    account_id: UUID | None = None
    bucket: str = ""
    # Whether files above settings.TRAINYARD["MULTIPART_THRESHOLD"] go up in parts.
    multipart = False

    @abstractmethod
    def key_root(self, workspace_id: object) -> str:
        """The prefix of every key of ``workspace_id``'s objects."""

    @abstractmethod
    def signed_url(self, key: str, *, method: Method, seconds: int | None = None, filename: str = "") -> str:
        """A URL that allows exactly ``method`` on ``key`` until it expires;
        a GET always downloads (attachment, application/octet-stream)."""

    def upload_target(self, key: str, *, sha256: str, size: int, seconds: int) -> Target:
        """Where one whole file is PUT: a URL bound to the file's checksum and
        its declared ``size`` (a larger body is refused)."""
        return Target(self.signed_url(key, method="PUT", seconds=seconds), {}, seconds)

    def multipart_create(self, key: str) -> str:
        """Start a multipart upload of ``key``; returns its upload id."""
        raise NotImplementedError(f"{type(self).__name__} does not upload in parts")

    def part_targets(self, key: str, *, upload_id: str, parts: list[tuple[int, str, int]]) -> list[Target]:
        """One PUT target per (part number, part sha256 hex, part size in bytes)."""
        raise NotImplementedError(f"{type(self).__name__} does not upload in parts")

    def multipart_complete(self, key: str, *, upload_id: str, parts: list[Part]) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not upload in parts")

    def multipart_abort(self, key: str, *, upload_id: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not upload in parts")

    @abstractmethod
    def verify(self, key: str, *, size: int, sha256: str, part_sha256s: list[str]) -> str:
        """ "" if ``key`` holds the file of the manifest (``size``, ``sha256``;
        a multipart upload: the sha256 of each part, in order), else what is wrong."""

    @abstractmethod
    def delete(self, keys: list[str]) -> None:
        """Delete the objects; a key that does not exist is no error."""

    @abstractmethod
    def write(self, key: str, chunks: Iterator[bytes]) -> int:
        """Store the bytes atomically (readers never see half a file); return the size."""

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """Raises FileNotFoundError when the key does not exist."""

    @abstractmethod
    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` .. ``end`` - 1 of the object; FileNotFoundError when there is none."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """None when the key does not exist."""


class LocalStorage(Storage):
    """Files under ``TRAINYARD_STORAGE_DIR``; URLs served by /storage/<token>."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def key_root(self, workspace_id: object) -> str:
        return f"workspaces/{workspace_id}"

    def verify(self, key: str, *, size: int, sha256: str, part_sha256s: list[str]) -> str:
        # Our own disk: reading the bytes back is cheap and the surest check.
        if self.size(key) != size:
            return "missing or of the wrong size"
        digest = hashlib.sha256()
        with self.open(key) as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        return "" if digest.hexdigest() == sha256 else "sha256 differs"

    def signed_url(
        self,
        key: str,
        *,
        method: Method,
        seconds: int | None = None,
        filename: str = "",
        sha256: str = "",
        size: int | None = None,
    ) -> str:
        lifetime = seconds or settings.TRAINYARD["SIGNED_URL_SECONDS"]
        expires = int(time.time() + lifetime)
        data: dict[str, object] = {"k": key, "m": method, "f": filename, "x": expires}
        if sha256:
            data["s"] = sha256
        if size is not None:
            data["n"] = size
        token = signing.dumps(data, salt=_SALT, compress=True)
        return f"{settings.PUBLIC_URL}/storage/{token}"

    def upload_target(self, key: str, *, sha256: str, size: int, seconds: int) -> Target:
        """A PUT bound to the file's sha256 and size, as S3's checksum and
        signed Content-Length bind it: other bytes, or more of them, are
        refused, and once the object is there only the same bytes are taken
        again (a finished artifact is immutable)."""
        url = self.signed_url(key, method="PUT", seconds=seconds, sha256=sha256, size=size)
        return Target(url, {}, seconds)

    def write_checked(self, key: str, chunks: Iterator[bytes], *, sha256: str, size: int | None = None) -> int:
        """``write`` for a PUT bound to ``sha256`` (and ``size``): the bytes are
        stored only if they hash to it (``ChecksumMismatch`` otherwise, nothing
        written); reading stops at the first byte beyond ``size``
        (``TooLarge``, nothing written); an object already there is never
        replaced (``ObjectExists`` unless the new bytes are the same)."""
        digest = hashlib.sha256()
        limit = size  # ``size`` below counts what was written

        def hashed() -> Iterator[bytes]:
            seen = 0
            for chunk in chunks:
                seen += len(chunk)
                if limit is not None and seen > limit:
                    raise TooLarge(f"the body is larger than the {limit:,} bytes this link was signed for")
                digest.update(chunk)
                yield chunk

        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
        size = 0
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in hashed():
                    out.write(chunk)
                    size += len(chunk)
            if digest.hexdigest() != sha256:
                raise ChecksumMismatch(f"the body's SHA-256 is {digest.hexdigest()}, the link is for {sha256}")
            try:
                os.link(tmp, target)  # fails if the object is there: it is never replaced
            except FileExistsError:
                if _sha256_of(target) != sha256:
                    raise ObjectExists("this object is already stored with other bytes") from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        return size

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)

    def write(self, key: str, chunks: Iterator[bytes]) -> int:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                    size += len(chunk)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return size

    def open(self, key: str) -> BinaryIO:
        return self._path(key).open("rb")

    def read_range(self, key: str, start: int, end: int) -> bytes:
        with self._path(key).open("rb") as f:
            f.seek(start)
            return f.read(end - start)

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def copy_file(self, key: str, source: Path) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ValueError(f"storage key escapes the storage root: {key!r}")
        return path


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class ChecksumMismatch(Exception):
    """A PUT's bytes are not the ones its link was signed for."""


class ObjectExists(Exception):
    """A PUT for an object that is already stored (with other bytes)."""


class TooLarge(Exception):
    """A PUT's body is larger than the size its link was signed for."""


@dataclass(frozen=True)
class SignedRequest:
    key: str
    method: Method
    filename: str
    sha256: str  # a PUT bound to its body's checksum; "" for none
    size: int | None = None  # a PUT bound to its body's size (bytes); None for none


def verify_token(token: str) -> SignedRequest:
    """What a signed storage URL allows; raises signing.BadSignature."""
    data = signing.loads(token, salt=_SALT)
    if time.time() > data["x"]:
        raise signing.SignatureExpired("the link has expired")
    size = data.get("n")
    return SignedRequest(
        data["k"], data["m"], data.get("f", ""), data.get("s", ""), int(size) if size is not None else None
    )


def redact_signed_urls(text: str) -> str:
    """``text`` with the credentials of every signed URL in it replaced by "…"
    (a reason that quotes a failed download must not hand out its link)."""
    return _URL.sub(_without_query, _TOKEN_IN_PATH.sub(r"\1…", text))


def _without_query(match: re.Match[str]) -> str:
    return f"{match[1]}?…" if match[2] else match[0]


def delete_quietly(storage: Storage, keys: list[str], what: str) -> None:
    """Delete ``keys``, logging a failure rather than raising it: the rows
    that pointed at them are gone, so an object left behind costs only
    storage (the garbage collector removes it from local storage)."""
    try:
        storage.delete(keys)
    except Exception:
        logger.warning("could not delete %s (%s)", what, ", ".join(keys), exc_info=True)


def delete_after_commit(storage: Storage, keys: list[str], what: str) -> None:
    """``delete_quietly`` once the caller's transaction commits: one that
    fails leaves its rows and their objects whole."""
    transaction.on_commit(partial(delete_quietly, storage, keys, what))


def get_storage() -> LocalStorage:
    """The installation's own storage: what a workspace without a bucket uses
    (backend/artifacts/locations.py picks per workspace and per object)."""
    kind = settings.TRAINYARD["STORAGE"]
    if kind == "local":
        return LocalStorage(Path(settings.TRAINYARD["STORAGE_DIR"]))
    raise RuntimeError(
        f"TRAINYARD_STORAGE={kind!r} is not supported (use 'local'; a workspace's own S3 bucket "
        "comes from its AWS connection, docs/STORAGE.md)."
    )

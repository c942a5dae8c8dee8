"""Object storage behind one small interface: local files now, S3 next.

Runners and the CLI never stream bytes through the API's websocket: they get
short-lived signed URLs from ``signed_url`` (presigned S3 URLs in the S3
implementation) and PUT or GET the bytes directly.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Literal

from django.conf import settings
from django.core import signing

Method = Literal["GET", "PUT"]
_SALT = "trainyard.storage"
# Where a signed URL carries its credential: the token in the path of our own
# links (/storage/<token>, /storage-archive/<token>, also when an error quotes
# only the path; a token is 100+ characters of base64 and ":", ending in the
# signature), the query of any other URL (presigned S3 URLs). Neither takes
# the punctuation of the sentence around it.
_TOKEN_IN_PATH = re.compile(r"(/storage(?:-archive)?/)[\w.:\-]{19,}[\w\-]")
_QUERY = re.compile(r"(https?://[^\s?#'\"<>]+)\?[^\s#'\"<>]*[^\s#'\"<>:.,;!)]")


class Storage(ABC):
    @abstractmethod
    def signed_url(self, key: str, *, method: Method, seconds: int | None = None, filename: str = "") -> str:
        """A URL that allows exactly ``method`` on ``key`` until it expires."""

    @abstractmethod
    def write(self, key: str, chunks: Iterator[bytes]) -> int:
        """Store the bytes atomically (readers never see half a file); return the size."""

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """Raises FileNotFoundError when the key does not exist."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """None when the key does not exist."""


class LocalStorage(Storage):
    """Files under ``TRAINYARD_STORAGE_DIR``; URLs served by /storage/<token>."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def signed_url(self, key: str, *, method: Method, seconds: int | None = None, filename: str = "") -> str:
        lifetime = seconds or settings.TRAINYARD["SIGNED_URL_SECONDS"]
        expires = int(time.time() + lifetime)
        token = signing.dumps({"k": key, "m": method, "f": filename, "x": expires}, salt=_SALT, compress=True)
        return f"{settings.PUBLIC_URL}/storage/{token}"

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


def verify_token(token: str) -> tuple[str, Method, str]:
    """(key, method, filename) of a signed storage URL; raises signing.BadSignature."""
    data = signing.loads(token, salt=_SALT)
    if time.time() > data["x"]:
        raise signing.SignatureExpired("the link has expired")
    return data["k"], data["m"], data.get("f", "")


def redact_signed_urls(text: str) -> str:
    """``text`` with the credentials of every signed URL in it replaced by "…"
    (a reason that quotes a failed download must not hand out its link)."""
    return _QUERY.sub(r"\1?…", _TOKEN_IN_PATH.sub(r"\1…", text))


def get_storage() -> Storage:
    kind = settings.TRAINYARD["STORAGE"]
    if kind == "local":
        return LocalStorage(Path(settings.TRAINYARD["STORAGE_DIR"]))
    raise RuntimeError(f"TRAINYARD_STORAGE={kind!r} is not supported yet (use 'local').")

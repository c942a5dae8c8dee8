"""Uploading a job's artifacts through the REST API (docs/API.md, "Runner
endpoints"): register the manifest, PUT each file to its url, complete.

A large file on S3 goes up in parts: the runner hashes a batch of parts,
asks the server for their presigned URLs, PUTs each part and keeps its ETag,
and finally tells the server the parts (it assembles the file). Signed URLs
are short-lived (S3: 15 minutes at most, and they die with the credentials
that signed them): a URL refused with 403, or about to expire, is replaced
by a fresh one from the server, and only that file or part is sent again.

Blocking (urllib); the job calls ``upload_artifacts`` in a thread.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urljoin

from .http import HttpError, post_json, put_file, same_origin
from .inputs import ABSOLUTE_REFUSED
from .retry import Backoff

log = logging.getLogger(__name__)

# Recoverable failures (network errors, 5xx, 429) are retried for
# retry.RETRY_SECONDS after the first one (--retry-seconds, 10 minutes by
# default), so that a server restart or a database failover while a job
# uploads its artifacts costs the job nothing; each file and each part is
# retried on its own, so what is done is not sent again.
# Fresh URLs asked for one file or part in a row (each refused with 403)
# before the upload fails: a 403 on a fresh URL is not an expiry.
MAX_FRESH_URLS = 3
URL_MARGIN = 30.0  # a URL with less than this left is replaced before use
PART_BATCH = 16  # parts hashed and signed per request
# Files and parts in flight at once, as boto3's upload_file keeps several parts
# in flight (bench/results/2026-12-01-spot.md measures the difference).
UPLOAD_THREADS = 8
T = TypeVar("T")


class ArtifactError(Exception):
    """An artifact could not be uploaded; the message says which and why.
    ``unanswered``: the server or storage did not answer (network errors,
    5xx, 429 past the retry budget), so a later try may succeed; otherwise
    the same try fails the same way (a missing path, a refusal)."""

    def __init__(self, message: str, *, unanswered: bool = False) -> None:
        super().__init__(message)
        self.unanswered = unanswered


class _Expired(Exception):
    """A signed URL was refused (403): ask the server for a fresh one."""


@dataclass(frozen=True)
class _Target:
    url: str
    headers: dict[str, str]
    expires_at: float | None = None  # time.monotonic(); None: unknown

    @property
    def stale(self) -> bool:
        return self.expires_at is not None and time.monotonic() > self.expires_at - URL_MARGIN


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the artifact path, "/"-separated
    size: int
    sha256: str


def upload_artifacts(
    paths: list[str], *, work: Path, job: str, attempt: int, api_url: str, token: str, absolute_ok: bool = False
) -> None:
    """Upload every artifact path (relative to ``work``, or with
    ``absolute_ok`` an absolute path of this machine) of ``job``'s
    ``attempt`` (the server refuses a stale attempt's). Missing paths are
    checked first, so nothing is uploaded for a job that will fail."""
    roots = [_resolve(work, p, absolute_ok=absolute_ok) for p in paths]
    for path, root in zip(paths, roots, strict=True):
        _upload_one(path, root, job=job, attempt=attempt, api_url=api_url.rstrip("/"), token=token)


def manifest(root: Path) -> list[FileEntry]:
    """Every regular file under ``root`` (or ``root`` itself if it is a file),
    sorted by path, with size and sha256."""
    if root.is_file():
        return [_entry(root, root.name)]
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            full = Path(dirpath) / name
            if full.is_file():
                entries.append(_entry(full, full.relative_to(root).as_posix()))
    return sorted(entries, key=lambda e: e.path)


def _resolve(work: Path, path: str, *, absolute_ok: bool = False) -> Path:
    if path.startswith("/"):
        if not absolute_ok:
            raise ArtifactError(f"artifact path {path} is outside the working directory: {ABSOLUTE_REFUSED}")
        root = Path(path).resolve()
    else:
        root = (work / path).resolve()
        if not root.is_relative_to(work.resolve()):
            raise ArtifactError(f"artifact path {path} is outside the working directory")
    if not root.exists():
        raise ArtifactError(f"artifact path {path} was not created by the job")
    return root


def _upload_one(path: str, root: Path, *, job: str, attempt: int, api_url: str, token: str) -> None:
    files = manifest(root)
    upload_tree(path, root, files, begin="artifacts", job=job, attempt=attempt, api_url=api_url, token=token)
    log.info("uploaded artifact %s (%d files)", path, len(files))


def upload_tree(
    path: str,
    root: Path,
    files: list[FileEntry],
    *,
    begin: str,
    job: str,
    attempt: int,
    api_url: str,
    token: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Register ``files`` (under ``root``) at ``runner/jobs/<job>/<begin>/``
    (``artifacts`` or ``checkpoints``), upload every file the server asks
    for, complete; returns the begin and complete answers."""
    body = {"path": path, "files": [e.__dict__ for e in files]}
    query = f"?attempt={attempt}"
    api_url = api_url.rstrip("/")
    created = _retry(lambda: post_json(f"{api_url}/runner/jobs/{job}/{begin}/{query}", body, token=token))
    server = _Server(f"{api_url}/runner/jobs/{job}/artifacts/{created['id']}/", query, api_url, token)
    by_path = {e.path: e for e in files}
    unknown = [u["path"] for u in created["uploads"] if u["path"] not in by_path]
    if unknown:
        raise ArtifactError(f"server asked for an unknown file {unknown[0]!r} of {path}")
    with ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="upload") as pool:
        whole = []
        for upload in created["uploads"]:
            local = root if root.is_file() else root / upload["path"]
            if upload.get("part_size"):
                part_size, count = int(upload["part_size"]), int(upload["parts"])
                _put_parts(server, upload["path"], local, part_size=part_size, count=count, pool=pool)
            else:
                first = _Target(server.absolute(upload["url"]), dict(upload.get("headers") or {}))
                whole.append(pool.submit(_put_whole, server, upload["path"], local, first))
        _all(whole)
    done = _retry(lambda: post_json(f"{server.base}complete/{query}", {}, token=token))
    return created, done or {}


def _all(futures: list[Future[T]]) -> list[T]:
    """Every result; the first failure is raised once all have finished
    (nothing is left uploading behind the error)."""
    wait(futures)
    return [f.result() for f in futures]


class _Server:
    """The artifact's endpoints on the server."""

    def __init__(self, base: str, query: str, api_url: str, token: str) -> None:
        self.base, self.query, self.api_url, self.token = base, query, api_url, token

    def absolute(self, url: str) -> str:
        return urljoin(self.api_url + "/", url)

    def headers(self, target: _Target) -> dict[str, str]:
        # The token goes only to our own server, never to object storage.
        own = same_origin(target.url, self.api_url)
        return {**target.headers, **({"Authorization": f"Bearer {self.token}"} if own else {})}

    def targets(self, path: str, parts: list[tuple[int, str]]) -> list[_Target]:
        """Fresh URLs for the whole file (``parts`` empty) or for these (number, sha256) parts."""
        body: dict[str, Any] = {"path": path}
        if parts:
            body["parts"] = [{"number": n, "sha256": sha} for n, sha in parts]
        answer = _retry(lambda: post_json(f"{self.base}urls/{self.query}", body, token=self.token))
        now = time.monotonic()
        return [
            _Target(self.absolute(t["url"]), dict(t.get("headers") or {}), now + float(t["seconds"]))
            for t in answer["targets"]
        ]

    def parts_done(self, path: str, parts: list[tuple[int, str, str]]) -> None:
        body = {"path": path, "parts": [{"number": n, "etag": e, "sha256": sha} for n, e, sha in parts]}
        _retry(lambda: post_json(f"{self.base}parts/{self.query}", body, token=self.token))


def _put_whole(server: _Server, path: str, local: Path, first: _Target) -> None:
    def put(target: _Target) -> str:
        return put_file(target.url, local, headers=server.headers(target), timeout=_put_timeout(local))

    def fresh() -> _Target:
        return server.targets(path, [])[0]

    _signed(put, first, fresh)


def _put_parts(
    server: _Server, path: str, local: Path, *, part_size: int, count: int, pool: ThreadPoolExecutor
) -> None:
    """Upload ``local`` in ``count`` parts of ``part_size`` bytes, a batch of
    URLs at a time, the batch's parts hashed and sent ``UPLOAD_THREADS`` at
    a time; a refused part gets a fresh URL and is sent again alone."""
    size = local.stat().st_size
    done: list[tuple[int, str, str]] = []
    for start in range(1, count + 1, PART_BATCH):
        numbers = list(range(start, min(start + PART_BATCH, count + 1)))
        spans = {n: ((n - 1) * part_size, min(part_size, size - (n - 1) * part_size)) for n in numbers}
        shas = dict(zip(numbers, _all([pool.submit(_sha256_of, local, *spans[n]) for n in numbers]), strict=True))
        targets = dict(zip(numbers, server.targets(path, [(n, shas[n]) for n in numbers]), strict=True))

        sends = [pool.submit(_put_part, server, path, local, n, spans[n], shas[n], targets[n]) for n in numbers]
        etags = _all(sends)
        done += [(n, etag, shas[n]) for n, etag in zip(numbers, etags, strict=True)]
    server.parts_done(path, done)


def _put_part(
    server: _Server, path: str, local: Path, number: int, span: tuple[int, int], sha256: str, target: _Target
) -> str:
    offset, length = span

    def put(t: _Target) -> str:
        timeout = 30.0 + length / (10 << 20)
        return put_file(t.url, local, headers=server.headers(t), timeout=timeout, offset=offset, length=length)

    return _signed(put, target, partial(_fresh_part, server, path, number, sha256))


def _fresh_part(server: _Server, path: str, number: int, sha256: str) -> _Target:
    return server.targets(path, [(number, sha256)])[0]


def _signed(call: Callable[[_Target], T], target: _Target, fresh: Callable[[], _Target]) -> T:
    """``call`` with ``target``; a URL about to expire, or refused with 403,
    is replaced by ``fresh()`` (at most MAX_FRESH_URLS times in a row)."""
    for asked in range(MAX_FRESH_URLS + 1):
        if target.stale:
            target = fresh()
        try:
            return _retry(partial(call, target), expired_ok=True)
        except _Expired as e:
            if asked == MAX_FRESH_URLS:
                raise ArtifactError(f"artifact upload failed: {e}") from None
            log.info("artifact upload: the signed URL was refused (expired?); asking for a fresh one")
            target = fresh()
    raise AssertionError("unreachable")


def _retry(call: Callable[[], T], *, expired_ok: bool = False) -> T:
    """Run ``call``; retry network errors and 5xx with backoff for
    ``retry.RETRY_SECONDS`` after the first failure, give up on 4xx at once
    (a 403 raises ``_Expired`` if ``expired_ok``). A refusal's message is the
    server's own (a storage quota's 413 says how much is used)."""
    backoff = Backoff()
    while True:
        try:
            return call()
        except (HttpError, OSError, http.client.HTTPException) as e:
            if expired_ok and isinstance(e, HttpError) and e.status == 403:
                raise _Expired(str(e)) from None
            recoverable = not isinstance(e, HttpError) or e.recoverable
            pause = backoff.pause() if recoverable else None
            if pause is None:
                raise ArtifactError(f"artifact upload failed: {e}", unanswered=recoverable) from e
            log.warning("artifact upload: %s (retrying in %.1fs)", e, pause)
            time.sleep(pause)


def _sha256_of(path: Path, offset: int, length: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        f.seek(offset)
        while length > 0 and (block := f.read(min(1 << 20, length))):
            digest.update(block)
            length -= len(block)
    return digest.hexdigest()


def _put_timeout(path: Path) -> float:
    # The timeout is per socket operation, but a slow link still needs more
    # time for a big file to be accepted at the end.
    return 30.0 + path.stat().st_size / (10 << 20)


def _entry(full: Path, rel: str) -> FileEntry:
    """``rel``'s size and sha256; a file the reader may not read (a link to
    what only root may read, for a job with a user of its own) is an
    ``ArtifactError`` naming it."""
    digest = hashlib.sha256()
    size = 0
    try:
        with full.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
                size += len(block)
    except PermissionError as e:
        raise ArtifactError(f"cannot read {rel}: {e.strerror}") from e
    return FileEntry(path=rel, size=size, sha256=digest.hexdigest())

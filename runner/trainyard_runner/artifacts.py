"""Uploading a job's artifacts through the REST API (docs/API.md, "Runner
endpoints"): register the manifest, PUT each file to its url, complete.

Blocking (urllib); the job calls ``upload_artifacts`` in a thread.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar
from urllib.parse import urljoin

from .http import HttpError, post_json, put_file, same_origin

log = logging.getLogger(__name__)

# Recoverable failures (network errors, 5xx, 429) are retried for this long
# after the first one, so that a server restart or a database failover while
# a job uploads its artifacts costs the job nothing; the pause between tries
# doubles from 1 s up to RETRY_PAUSE_MAX.
RETRY_FOR = 600.0
RETRY_PAUSE_MAX = 10.0
T = TypeVar("T")


class ArtifactError(Exception):
    """An artifact could not be uploaded; the message says which and why."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the artifact path, "/"-separated
    size: int
    sha256: str


def upload_artifacts(paths: list[str], *, work: Path, job: str, attempt: int, api_url: str, token: str) -> None:
    """Upload every artifact path (relative to ``work``) of ``job``'s
    ``attempt`` (the server refuses a stale attempt's). Missing paths are
    checked first, so nothing is uploaded for a job that will fail."""
    roots = [_resolve(work, p) for p in paths]
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


def _resolve(work: Path, path: str) -> Path:
    root = (work / path).resolve()
    if not root.is_relative_to(work.resolve()):
        raise ArtifactError(f"artifact path {path} is outside the working directory")
    if not root.exists():
        raise ArtifactError(f"artifact path {path} was not created by the job")
    return root


def _upload_one(path: str, root: Path, *, job: str, attempt: int, api_url: str, token: str) -> None:
    files = manifest(root)
    body = {"path": path, "files": [e.__dict__ for e in files]}
    query = f"?attempt={attempt}"
    created = _retry(lambda: post_json(f"{api_url}/runner/jobs/{job}/artifacts/{query}", body, token=token))
    by_path = {e.path: e for e in files}
    for upload in created["uploads"]:
        url = urljoin(api_url + "/", upload["url"])
        # The token goes only to our own server, never to object storage.
        headers = {"Authorization": f"Bearer {token}"} if same_origin(url, api_url) else {}
        if upload["path"] not in by_path:
            raise ArtifactError(f"server asked for an unknown file {upload['path']!r} of {path}")
        local = root if root.is_file() else root / upload["path"]
        _retry(partial(put_file, url, local, headers=headers, timeout=_put_timeout(local)))
    complete = f"{api_url}/runner/jobs/{job}/artifacts/{created['id']}/complete/{query}"
    _retry(lambda: post_json(complete, {}, token=token))
    log.info("uploaded artifact %s (%d files)", path, len(files))


def _retry(call: Callable[[], T]) -> T:
    """Run ``call``; retry network errors and 5xx with backoff for
    ``RETRY_FOR`` seconds after the first failure, give up on 4xx at once."""
    deadline, pause = None, 1.0
    while True:
        try:
            return call()
        except (HttpError, OSError, http.client.HTTPException) as e:
            deadline = deadline or time.monotonic() + RETRY_FOR
            recoverable = not isinstance(e, HttpError) or e.recoverable
            if not recoverable or time.monotonic() + pause > deadline:
                raise ArtifactError(f"artifact upload failed: {e}") from e
            log.warning("artifact upload: %s (retrying in %.0fs)", e, pause)
            time.sleep(pause)
            pause = min(pause * 2, RETRY_PAUSE_MAX)


def _put_timeout(path: Path) -> float:
    # The timeout is per socket operation, but a slow link still needs more
    # time for a big file to be accepted at the end.
    return 30.0 + path.stat().st_size / (10 << 20)


def _entry(full: Path, rel: str) -> FileEntry:
    digest = hashlib.sha256()
    size = 0
    with full.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    return FileEntry(path=rel, size=size, sha256=digest.hexdigest())

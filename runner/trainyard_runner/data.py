"""A job's data inputs (``AssignJob.data``: ``s3://…``, ``https://…``),
fetched into the machine's cache and placed into its working tree before
its commands run (docs/DATA.md).

1. **List**: each input's files are read page by page from the server
   (``GET …/runner/jobs/<job>/data/?path=&after=``), exactly
   ``DataInput.file_count`` of them.
2. **Disk**: the bytes the cache lacks (plus the copies of inputs that are
   not read-only) are compared with the free space of the work dir; the
   cache is evicted to make room, and what still does not fit fails the job
   with both sizes, before any download.
3. **Fetch**: every missing file is downloaded by a pool of ``WORKERS``
   threads; a file larger than ``2 × PART`` in ``PART``-sized ranged GETs
   written with ``pwrite`` into a preallocated ``.partial``. Network errors,
   5xx and 429 are retried (a cut range resumes where it was), a URL
   refused with 403 is replaced by a fresh one from the server. Verified:
   the size always, the response's ETag against ``DataFile.etag`` (another
   one: the object changed since the run listed it), the sha256 where known.
4. **Cache**: ``<work dir>/data/<identity[:2]>/<identity>``, renamed into
   place once verified and never written again (0444). A snapshot's
   identities are in ``snapshots/<snapshot>.json``; once its every file is
   there, ``snapshots/<snapshot>.complete`` says so: the heartbeat reports
   those (``cached``). A job holds
   ``snapshots/<snapshot>.use`` shared from before it looks until it ends;
   ``evict`` passes by every file of a held snapshot.
5. **Place**: ``<work>/<input.path>`` is built beside its place
   (``.<name>.trainyard-partial``) and renamed there when complete: a
   read-only input as hard links to the cache's files (a job with a user of
   its own cannot write them: they are root's), any other as copies the
   job owns.

Blocking work runs in a daemon thread (``inputs.with_progress``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import http.client
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from .http import HttpError, open_get
from .inputs import MAX_FRESH_URLS, TIMEOUT, InputError, Progress, read_pages, resumes_at, with_progress
from .jobuser import JobUser
from .protocol import MAX_DATA_CACHED, DataFile, DataInput, DataPage
from .retry import Backoff

log = logging.getLogger(__name__)

CACHE_DIR = "data"  # under the runner's work dir
SNAPSHOTS = "snapshots"
COMPLETE = ".complete"  # ``snapshots/<snapshot>.complete``: every file is cached (mtime: last used)
WORKERS = 16  # files (or ranges of a large file) downloaded at once
PART = 16 << 20  # bytes of one ranged GET of a large file
CHUNK = 1 << 20  # bytes read from a response at a time
FSYNC = True  # a cache file reaches the disk before it is renamed into place (decision: data-cache)
MAX_BYTES_VAR, MAX_AGE_VAR = "TRAINYARD_DATA_CACHE_MAX_BYTES", "TRAINYARD_DATA_CACHE_MAX_AGE_DAYS"
DEFAULT_MAX_AGE_DAYS = 30

# (DataInput.path, the previous page's next or "") -> that page of its files.
DataPageOf = Callable[[str, str], DataPage]
# (DataInput.path, DataFile.path) -> a fresh URL for that file.
FreshDataUrl = Callable[[str, str], str]


class DataError(InputError):
    """A data input could not be fetched or placed; the message names it and says why."""


class _Retry(Exception):
    """A network problem worth another attempt, from byte ``at`` of the file."""

    def __init__(self, message: str, *, at: int) -> None:
        super().__init__(message)
        self.at = at


class _Stopped(Exception):
    """The job was cancelled while fetching."""


async def fetch_data(
    inputs: list[DataInput],
    work: Path,
    *,
    cache_root: Path,
    page: DataPageOf,
    fresh_url: FreshDataUrl | None = None,
    report: Callable[[str], Awaitable[None]] | None = None,
    user: JobUser | None = None,
) -> Hold:
    """Fetch ``inputs`` into the cache at ``cache_root`` and place them into
    ``work`` (module docstring); returns the hold on their snapshots, which
    the caller releases when the job ends. Raises ``DataError``."""
    cache = Cache(cache_root)
    hold = await asyncio.to_thread(cache.hold, [i.snapshot for i in inputs])  # waits out an eviction
    try:
        listed = [await _list(item, work, cache=cache, page=page) for item in inputs]
        await asyncio.to_thread(_check_disk, listed, cache, work)
        for one in listed:
            await _fetch_one(one, cache=cache, fresh_url=fresh_url, report=report, user=user)
    except BaseException:
        hold.release()
        raise
    return hold


@dataclass(frozen=True)
class _Listed:
    item: DataInput  # with its files
    target: Path
    missing: list[DataFile]  # not in the cache yet


async def _list(item: DataInput, work: Path, *, cache: Cache, page: DataPageOf) -> _Listed:
    target = _target(work, item)
    files = await asyncio.to_thread(read_pages, page, item.path, item.file_count)
    item = item.model_copy(update={"files": files})
    await asyncio.to_thread(cache.want, item)
    return _Listed(item, target, await asyncio.to_thread(cache.missing, files))


async def _fetch_one(
    one: _Listed,
    *,
    cache: Cache,
    fresh_url: FreshDataUrl | None,
    report: Callable[[str], Awaitable[None]] | None,
    user: JobUser | None,
) -> None:
    started = time.monotonic()
    item, missing = one.item, one.missing
    reason = describe(item, missing)
    if report is not None:
        await report(reason)
    fresh = None if fresh_url is None else (lambda f: fresh_url(item.path, f.path))
    total = sum(f.size for f in missing)
    await with_progress(lambda progress: _download(missing, cache, progress, fresh, item.uri), reason, total, report)
    await asyncio.to_thread(cache.record, item)
    await asyncio.to_thread(place, item, one.target, cache, user=user)
    log.info("%s: ready in %.1fs", reason, time.monotonic() - started)
    if missing:
        removed = await asyncio.to_thread(cache.evict)
        if removed:
            log.info("data cache: evicted %d files", removed)


def describe(item: DataInput, missing: list[DataFile]) -> str:
    """``fetching data s3://… (200 files, 1.2 GB; 150 cached)``: the progress reason."""
    n = len(item.files)
    cached = n - len(missing)
    size = sum(f.size for f in item.files)
    return f"fetching data {item.uri} ({n} file{'' if n == 1 else 's'}, {gb(size)}; {cached} cached)"


def gb(size: int) -> str:
    """Bytes as people read sizes of datasets: ``212.0 GB``, ``1.2 MB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


# ---------------------------------------------------------------- the cache


@dataclass
class Hold:
    """A job's shared locks on the snapshots it uses: ``evict`` passes their files by."""

    fds: list[int] = field(default_factory=list)

    def release(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)


class Cache:
    """The machine's data cache under ``root`` (module docstring, 4)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.snapshots = root / SNAPSHOTS

    def path_of(self, identity: str) -> Path:
        return self.root / identity[:2] / identity

    def missing(self, files: list[DataFile]) -> list[DataFile]:
        """The files the cache does not hold, each identity once; the ones it
        holds are marked used now (eviction goes by last use)."""
        missing: dict[str, DataFile] = {}
        now = time.time()
        for f in files:
            if f.identity in missing:
                continue
            path = self.path_of(f.identity)
            try:
                if os.stat(path).st_size == f.size:
                    os.utime(path, (now, now))
                    continue
            except OSError:
                pass
            missing[f.identity] = f
        return list(missing.values())

    def hold(self, snapshots: list[str]) -> Hold:
        """Shared locks on ``snapshots`` (waiting while an eviction runs)."""
        self.snapshots.mkdir(parents=True, exist_ok=True)
        for folder in (self.root, self.snapshots):
            os.chmod(folder, 0o700)  # a job reaches its files through its own links only
        hold = Hold()
        try:
            for snapshot in sorted(set(snapshots)):
                fd = os.open(self.snapshots / f"{snapshot}.use", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                hold.fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            hold.release()
            raise
        return hold

    def want(self, item: DataInput) -> None:
        """Record the identities of ``item``'s files before they are fetched:
        eviction keeps those of a held snapshot, complete or not."""
        index = self.snapshots / f"{item.snapshot}.json"
        if index.exists():  # a snapshot's files never change: it is a digest of them
            return
        body = {"uri": item.uri, "identities": sorted({f.identity for f in item.files})}
        part = index.with_name(f"{index.name}.{secrets.token_hex(4)}.partial")
        part.write_text(json.dumps(body))
        os.replace(part, index)

    def record(self, item: DataInput) -> None:
        """``item``'s every file is in the cache: its snapshot counts as
        cached, as used now (``<snapshot>.complete``)."""
        (self.snapshots / f"{item.snapshot}{COMPLETE}").touch()

    def cached(self) -> list[str]:
        """The snapshots whose every file the cache holds, most recently used
        first, at most ``MAX_DATA_CACHED``."""
        found = []
        for path in self.snapshots.glob(f"*{COMPLETE}") if self.snapshots.is_dir() else ():
            with contextlib.suppress(OSError):
                found.append((path.stat().st_mtime, path.name.removesuffix(COMPLETE)))
        return [snapshot for _, snapshot in sorted(found, reverse=True)[:MAX_DATA_CACHED]]

    def size(self) -> int:
        """Bytes of the cache's files."""
        return sum(size for _, size, _, _ in self._files())

    def evict(self, *, max_bytes: int | None = None, max_age_seconds: float | None = None) -> int:
        """Remove the cache's files unused for ``max_age_seconds``, then the
        least recently used while the cache holds more than ``max_bytes``
        (``TRAINYARD_DATA_CACHE_MAX_BYTES``, default half the disk;
        ``TRAINYARD_DATA_CACHE_MAX_AGE_DAYS``, default 30). Every file of a
        snapshot a job holds stays, and so does one a job's tree links to.
        A snapshot that lost a file is no longer cached. Returns the files removed."""
        if max_bytes is None:
            max_bytes = _env_int(MAX_BYTES_VAR, _disk_size(self.root) // 2)
        if max_age_seconds is None:
            max_age_seconds = _env_int(MAX_AGE_VAR, DEFAULT_MAX_AGE_DAYS) * 86400.0
        with self._evicting() as held:
            kept = {i for snapshot in held for i in _identities(self._index(snapshot))}
            files = sorted(self._files())
            total = sum(size for _, size, _, _ in files)
            now, removed = time.time(), set()
            for used, size, links, path in files:
                if total <= max_bytes and now - used <= max_age_seconds:
                    continue
                if path.name in kept or links > 1:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed.add(path.name)
                    total -= size
            if removed:
                self._forget(removed)
        return len(removed)

    @contextlib.contextmanager
    def _evicting(self) -> Iterator[set[str]]:
        """The snapshots a job holds; those no job holds are locked for the
        eviction's time (a job starting meanwhile waits for it)."""
        locked: list[int] = []
        held: set[str] = set()
        try:
            for use in self.snapshots.glob("*.use"):
                fd = os.open(use, os.O_RDWR | os.O_CLOEXEC)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    held.add(use.stem)
                    os.close(fd)
                    continue
                locked.append(fd)
            yield held
        finally:
            for fd in locked:
                os.close(fd)

    def _forget(self, removed: set[str]) -> None:
        """Snapshots with a removed file are no longer cached."""
        for done in self.snapshots.glob(f"*{COMPLETE}"):
            if removed.intersection(_identities(self._index(done.name.removesuffix(COMPLETE)))):
                done.unlink(missing_ok=True)

    def _files(self) -> Iterator[tuple[float, int, int, Path]]:
        """(last used, size, links, path) of every cache file."""
        for folder in self.root.glob("??"):
            for entry in os.scandir(folder):
                if entry.name.endswith(".partial"):
                    continue
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    yield st.st_mtime, st.st_size, st.st_nlink, Path(entry.path)

    def _index(self, snapshot: str) -> dict[str, object]:
        try:
            index = json.loads((self.snapshots / f"{snapshot}.json").read_bytes())
        except (OSError, ValueError):
            return {}
        return index if isinstance(index, dict) else {}


def _identities(index: dict[str, object]) -> list[str]:
    found = index.get("identities")
    return [i for i in found if isinstance(i, str)] if isinstance(found, list) else []


def cached(work_dir: Path) -> list[str]:
    """``Heartbeat.data_cached`` of the runner whose work dir is ``work_dir``."""
    return Cache(work_dir / CACHE_DIR).cached()


# ---------------------------------------------------------------- disk


def _check_disk(listed: list[_Listed], cache: Cache, work: Path) -> None:
    """Fail before any download when the bytes to write (each missing file
    once, and the copies of inputs that are not read-only) do not fit, after
    evicting what no job holds to make room."""
    missing = {f.identity: f.size for one in listed for f in one.missing}
    copies = sum(f.size for one in listed if not one.item.read_only for f in one.item.files)
    need = sum(missing.values()) + copies
    free = _free(work)
    if need <= free:
        return
    cache.evict(max_bytes=max(0, cache.size() - (need - free)))
    free = _free(work)
    if need > free:
        uris = [one.item.uri for one in listed if one.missing or not one.item.read_only]
        which = f"input {uris[0]} needs" if len(uris) == 1 else f"inputs {', '.join(uris)} need"
        raise DataError(f"{which} {gb(need)} more; the machine has {gb(free)} free")


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _disk_size(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def _env_int(name: str, default: float) -> int:
    raw = os.environ.get(name) or ""
    try:
        return int(float(raw)) if raw else int(default)
    except ValueError:
        raise DataError(f"{name}={raw!r} is not a number") from None


# ---------------------------------------------------------------- download


def _download(
    files: list[DataFile],
    cache: Cache,
    progress: Progress,
    fresh: Callable[[DataFile], str] | None,
    uri: str,
) -> None:
    """Fetch ``files`` into the cache, ``WORKERS`` ranges at once; the first
    failure stops the others and raises ``DataError`` naming the file."""
    if not files:
        return
    stop = progress.stop
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="trainyard-data") as pool:
        futures: dict[Future[None], _File] = {}
        for f in files:
            one = _File(f, cache.path_of(f.identity), progress, fresh)
            for start, end in one.ranges():
                futures[pool.submit(one.fetch_range, start, end, stop)] = one
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((fut for fut in done if fut.exception() is not None), None)
        if failed is not None:
            stop.set()
            wait(futures)
            for one in set(futures.values()):
                one.discard()
            error = failed.exception()
            if isinstance(error, _Stopped):
                return
            if isinstance(error, DataError):
                label = f"{uri.rstrip('/')}/{futures[failed].file.path}".rstrip("/")
                raise DataError(f"could not fetch input {label}: {error}") from error
            raise error  # type: ignore[misc]


class _File:
    """One file being downloaded into ``<dest>.<random>.partial``, by one or several ranges."""

    def __init__(self, f: DataFile, dest: Path, progress: Progress, fresh: Callable[[DataFile], str] | None) -> None:
        self.file = f
        self.dest = dest
        self.part = dest.with_name(f"{dest.name}.{secrets.token_hex(4)}.partial")
        self.progress = progress
        self.url = f.url
        self._fresh = fresh
        self._fresh_asked = 0  # in a row, without a byte in between
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._left = 0  # ranges not written yet
        self._whole = False  # the server ignores Range: the first range's GET wrote it all

    def ranges(self) -> list[tuple[int, int]]:
        """(start, end) byte ranges, end exclusive; one for a small file."""
        size = self.file.size
        spans = [(0, size)] if size <= 2 * PART else [(s, min(s + PART, size)) for s in range(0, size, PART)]
        self._left = len(spans)
        return spans

    def fetch_range(self, start: int, end: int, stop: threading.Event) -> None:
        """Download bytes ``start``..``end`` (retried, resuming where a cut
        GET got to); the last range to end finishes the file."""
        fd = self._open()
        pos, best, backoff = start, start, Backoff()
        while True:
            if stop.is_set():
                raise _Stopped
            try:
                self._get(fd, start, pos, end, stop)
                break
            except _Retry as e:
                if e.at >= best + CHUNK:  # progress: the retry budget starts again
                    backoff.reset()
                best, pos = max(best, e.at), e.at
                pause = backoff.pause()
                if pause is None:
                    raise DataError(str(e)) from e
                log.warning("data download: %s (retrying in %.1fs)", e, pause)
                if stop.wait(pause):
                    raise _Stopped from None
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._finish()

    def discard(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        self.part.unlink(missing_ok=True)

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                self.dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self._fd = os.open(self.part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                    os.ftruncate(self._fd, self.file.size)
                except OSError as e:
                    raise DataError(f"cannot write the cache: {e.strerror or e}") from e
            return self._fd

    def _get(self, fd: int, start: int, pos: int, end: int, stop: threading.Event) -> None:
        """One GET of ``pos``..``end``. Raises ``_Retry`` for network errors,
        5xx, 429 and a body that ended early. A server that ignores ``Range``
        gets the whole file written by the first range's GET."""
        if self._whole:
            if start != 0:
                return
            pos, end = 0, self.file.size
        ranged = not (pos == 0 and end == self.file.size)
        resp = self._open_url({"Range": f"bytes={pos}-{end - 1}"} if ranged else {}, pos)
        with resp:
            self._check_etag(resp)
            if ranged and not resumes_at(resp, pos):
                if start != 0 and not self._whole:
                    return  # the server ignores Range: the first range writes the whole file
                self._whole, ranged, pos, end = True, False, 0, self.file.size
            self._read_into(fd, resp, pos, end, stop)
            if not ranged and resp.read(1):
                raise DataError(f"size mismatch: more than the listed {self.file.size} bytes")

    def _open_url(self, headers: dict[str, str], pos: int) -> http.client.HTTPResponse:
        url = self.url
        try:
            return open_get(url, headers=headers, timeout=TIMEOUT)  # type: ignore[no-any-return]
        except HttpError as e:
            if e.recoverable:
                raise _Retry(str(e), at=pos) from e
            if e.status == 403:
                self._renew(url, e, pos)
            raise DataError(str(e)) from e

    def _renew(self, refused_url: str, refused: HttpError, pos: int) -> None:
        """Replace a URL the storage refused (403) once for all this file's
        ranges; raises ``_Retry`` to try it, ``DataError`` when there is no
        way to get one or too many were refused."""
        with self._lock:
            if self.url != refused_url:  # another range renewed it meanwhile
                raise _Retry("the link expired", at=pos)
            if self._fresh is None or self._fresh_asked >= MAX_FRESH_URLS:
                raise DataError(str(refused))
            self._fresh_asked += 1
            try:
                self.url = self._fresh(self.file)
            except HttpError as e:
                if e.recoverable:
                    raise _Retry(f"asking for a fresh link: {e}", at=pos) from e
                raise DataError(f"asking for a fresh link: {e.server_message}") from e
        log.info("data download: the link was refused (expired?); got a fresh one")
        raise _Retry("the link expired", at=pos)

    def _check_etag(self, resp: http.client.HTTPResponse) -> None:
        got = (resp.headers.get("ETag") or "").strip().removeprefix("W/").strip('"')
        if self.file.etag and got and got != self.file.etag:
            raise DataError(f"changed since the run listed it (ETag {got}, listed {self.file.etag})")

    def _read_into(self, fd: int, resp: http.client.HTTPResponse, pos: int, end: int, stop: threading.Event) -> None:
        while pos < end:
            if stop.is_set():
                raise _Stopped
            try:
                chunk = resp.read(min(CHUNK, end - pos))
            except (OSError, http.client.HTTPException) as e:
                raise _Retry(f"download interrupted after {pos} of {self.file.size} bytes: {e}", at=pos) from e
            if not chunk:
                raise _Retry(f"download ended after {pos} of {self.file.size} bytes", at=pos)
            os.pwrite(fd, chunk, pos)
            pos += len(chunk)
            self._fresh_asked = 0
            self.progress.add(len(chunk))

    def _finish(self) -> None:
        """Verify the whole file and rename it into the cache, read-only."""
        fd = self._fd
        assert fd is not None
        if os.fstat(fd).st_size != self.file.size:
            raise DataError(f"size mismatch: {os.fstat(fd).st_size} bytes, listed {self.file.size}")
        if self.file.sha256:
            digest = _sha256_of(fd)
            if digest != self.file.sha256.lower():
                raise DataError(f"sha256 mismatch: got {digest}, expected {self.file.sha256.lower()}")
        os.fchmod(fd, 0o444)
        if FSYNC:
            os.fsync(fd)
        os.replace(self.part, self.dest)
        with self._lock:
            os.close(fd)
            self._fd = None


def _sha256_of(fd: int) -> str:
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, CHUNK * 4, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- placing


def _target(work: Path, item: DataInput) -> Path:
    root = work.resolve()
    target = (work / item.path).resolve()
    if target == root or not target.is_relative_to(root):
        raise DataError(f"could not place input {item.uri} at {item.path}: the path is outside the working directory")
    return target


def place(item: DataInput, target: Path, cache: Cache, *, user: JobUser | None = None) -> None:
    """Build ``item`` beside ``target`` and rename it there once complete
    (module docstring, 5). A read-only input's folders are root's when the
    job has a user of its own; everything else is the job's."""
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise DataError(f"could not place input {item.uri} at {item.path}: the checkout already has something there")
    new_parents = [p for p in reversed(target.parents) if not p.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    building = target.with_name(f".{target.name}.trainyard-partial")
    _remove(building)
    try:
        for f in item.files:
            _place_file(item, f, building, cache)
        if user is not None:
            _give(building, user, files=not item.read_only)
        _remove(target)
        os.rename(building, target)
    except OSError as e:
        raise DataError(f"could not place input {item.uri} at {item.path}: {e.strerror or e}") from e
    finally:
        _remove(building)
    if user is not None:
        for folder in new_parents:
            os.chown(folder, user.uid, user.gid)


def _place_file(item: DataInput, f: DataFile, building: Path, cache: Cache) -> None:
    dest = (building / f.path) if f.path else building
    if f.path and not dest.resolve().is_relative_to(building.resolve()):
        raise DataError(f"could not place input {item.uri}: {f.path} is outside the input's path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    source = cache.path_of(f.identity)
    if item.read_only:
        try:
            os.link(source, dest)
            return
        except OSError:  # another filesystem: a copy, read-only too
            shutil.copyfile(source, dest)
            os.chmod(dest, 0o444)
            return
    shutil.copyfile(source, dest)
    os.chmod(dest, 0o644)


def _give(building: Path, user: JobUser, *, files: bool) -> None:
    """The job's user owns the folders of a writable input and its copies;
    a read-only input stays root's (folders 0755, files 0444)."""
    if not files:
        for folder, _, _ in os.walk(building):
            os.chmod(folder, 0o755)
        return
    user.give(building)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)

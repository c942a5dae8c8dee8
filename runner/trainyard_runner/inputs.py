"""Fetching a job's input artifacts (``AssignJob.inputs``) before its commands run.

Every file goes to ``<work>/<input.path>/<file.path>``, streamed from its
signed url to ``<name>.partial`` while its sha256 is computed, checked against
the expected size and digest, then renamed into place. Network errors, 5xx
and 429 are retried (an interrupted download resumes with a ``Range`` request
when the server supports it); a URL refused with 403 (signed URLs expire: S3's
after 15 minutes at most) is replaced by a fresh one from the server and the
download resumes where it was; anything else fails the job with a reason that
names the file: ``could not fetch input ./base_model/weights.json: sha256 mismatch``.

Blocking (urllib); ``fetch_inputs`` runs the downloads in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import logging
import os
import posixpath
import re
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

from .http import HttpError, open_get
from .protocol import InputArtifact, InputFile, InputPage
from .retry import Backoff

# Why a runner of the local backend refuses an absolute path (``--no-absolute-paths``).
ABSOLUTE_REFUSED = (
    "this runner takes no absolute paths (the local backend runs on the server's own host); run the job on a"
    " cloud or self-hosted machine"
)

log = logging.getLogger(__name__)

MAX_FRESH_URLS = 3  # fresh URLs asked for one file, each refused with 403, before giving up
TIMEOUT = 30.0  # per socket operation
CHUNK = 1 << 20
PROGRESS_EVERY = 10.0  # seconds between progress reports while fetching
_CONTENT_RANGE = re.compile(r"bytes (\d+)-\d+/(?:\d+|\*)")


class InputError(Exception):
    """An input could not be fetched; the message names the file and says why."""


class _Retry(Exception):
    """A network problem worth another attempt."""


class _Stopped(Exception):
    """The job was cancelled while fetching."""


# (InputArtifact.path, InputFile.path) -> a fresh signed URL for that file.
FreshUrl = Callable[[str, str], str]


# (InputArtifact.path, the previous page's next or "") -> that page of its files.
FetchPage = Callable[[str, str], InputPage]
_F = TypeVar("_F")
_F_co = TypeVar("_F_co", covariant=True)


class Paged(Protocol[_F_co]):
    """A page of an input's files (``InputPage``, ``DataPage``)."""

    @property
    def files(self) -> Sequence[_F_co]: ...

    @property
    def next(self) -> str: ...


MANIFEST_ATTEMPTS = 3  # per page, for network errors and 5xx


def fetch_manifests(inputs: list[InputArtifact], page: FetchPage) -> list[InputArtifact]:
    """The inputs with their ``files`` filled in, read page by page (protocol
    3: the assignment names only each input's ``file_count``). Blocking;
    raises ``InputError`` naming the input."""
    return [
        artifact.model_copy(update={"files": read_pages(page, artifact.path, artifact.file_count)})
        for artifact in inputs
    ]


def read_pages(page: Callable[[str, str], Paged[_F]], path: str, count: int) -> list[_F]:
    """Every file of the input at ``path``, read page by page: exactly
    ``count`` of them, or ``InputError`` naming the input (a server whose
    pages do not end, or list more or fewer, is refused)."""
    files: list[_F] = []
    after = ""
    while count:
        got = _page(page, path, after)
        files += got.files
        if not got.next:
            break
        if got.next == after or len(files) > count:  # a server that never ends its pages
            raise InputError(f"could not list input {path}: the server's pages do not end")
        after = got.next
    if len(files) != count:
        raise InputError(f"could not list input {path}: {len(files)} of {count} files listed")
    return files


def _page(page: Callable[[str, str], Paged[_F]], path: str, after: str) -> Paged[_F]:
    for attempt in range(1, MANIFEST_ATTEMPTS + 1):
        try:
            return page(path, after)
        except HttpError as e:
            if not e.recoverable or attempt == MANIFEST_ATTEMPTS:
                raise InputError(f"could not list input {path}: {e.server_message}") from e
            log.warning("listing input %s: %s (retrying)", path, e)
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class PlannedFile:
    label: str  # "./base_model/weights.json", for messages
    dest: Path
    file: InputFile
    artifact: str = ""  # InputArtifact.path


def plan(inputs: list[InputArtifact], work: Path, *, absolute_ok: bool = False) -> list[PlannedFile]:
    """Where every file goes; refuses any path that leaves ``work`` (``..``,
    symlinks in the code that point outside), and an artifact at an absolute
    path (restored at that same path) unless ``absolute_ok``."""
    planned = []
    for artifact in inputs:
        absolute = artifact.path.startswith("/")
        if absolute and not absolute_ok:
            raise InputError(f"could not fetch input {artifact.path}: {ABSOLUTE_REFUSED}")
        base = Path(artifact.path) if absolute else work
        root = base.resolve()
        for f in artifact.files:
            label = posixpath.join(artifact.path, f.path)
            dest = (base / f.path if absolute else work / artifact.path / f.path).resolve()
            if not f.path or dest == root or not dest.is_relative_to(root):
                raise InputError(f"could not fetch input {label}: the path is outside the working directory")
            planned.append(PlannedFile(label, dest, f, artifact.path))
    return planned


def describe(planned: list[PlannedFile]) -> str:
    """``fetching inputs (N files, X MB)``: the progress reason."""
    n = len(planned)
    return f"fetching inputs ({n} file{'' if n == 1 else 's'}, {mb(sum(p.file.size for p in planned))})"


async def fetch_inputs(
    inputs: list[InputArtifact],
    work: Path,
    *,
    report: Callable[[str], Awaitable[None]] | None = None,
    fresh_url: FreshUrl | None = None,
    absolute_ok: bool = False,
) -> None:
    """Fetch every input file into ``work`` (an artifact at an absolute path:
    there, with ``absolute_ok``); raises ``InputError``. ``report``
    gets the progress reason at the start and every ``PROGRESS_EVERY`` seconds;
    ``fresh_url`` (blocking) replaces a URL refused with 403.
    Cancelling stops the download thread at its next chunk."""
    planned = plan(inputs, work, absolute_ok=absolute_ok)
    if not planned:
        return
    reason = describe(planned)
    total = sum(p.file.size for p in planned)
    if report is not None:
        await report(reason)
    started = time.monotonic()
    await with_progress(lambda progress: fetch_all(planned, progress, fresh_url), reason, total, report)
    log.info("%s done in %.1fs", reason, time.monotonic() - started)


async def with_progress(
    work: Callable[[Progress], None], reason: str, total: int, report: Callable[[str], Awaitable[None]] | None
) -> None:
    """Run ``work`` (blocking) in a daemon thread, reporting ``reason: N%``
    of ``total`` bytes every ``PROGRESS_EVERY`` seconds. Cancelling sets
    ``Progress.stop``: the thread stops at its next chunk."""
    progress = Progress()
    fut = in_daemon_thread(work, progress)
    try:
        while True:
            done, _ = await asyncio.wait({fut}, timeout=PROGRESS_EVERY)
            if done:
                break
            if report is not None and total:
                await report(f"{reason}: {min(progress.bytes * 100 // total, 99)}%")
        fut.result()
    except asyncio.CancelledError:
        progress.stop.set()  # its outcome is ignored
        fut.cancel()
        raise


def in_daemon_thread(fn: Callable[..., None], *args: object) -> asyncio.Future[None]:
    """Run ``fn`` in a daemon thread: unlike the default executor, a download
    stuck in a socket read cannot hold up the runner's exit."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if fut.done():  # cancelled meanwhile
            return
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)

    def target() -> None:
        error: BaseException | None = None
        try:
            fn(*args)
        except BaseException as e:  # handed to the awaiting coroutine
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=target, name="trainyard-inputs", daemon=True).start()
    return fut


class Progress:
    def __init__(self) -> None:
        self.bytes = 0  # written by the download threads, read by the loop
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        """Count ``n`` bytes more (or fewer), from any of several threads."""
        with self._lock:
            self.bytes += n


def fetch_all(planned: list[PlannedFile], progress: Progress, fresh_url: FreshUrl | None = None) -> None:
    """Download every file; one whose content (sha256) was already fetched
    is copied from there instead (inputs with many identical files)."""
    fetched: dict[str, Path] = {}
    for p in planned:
        fresh = None if fresh_url is None else (lambda p=p: fresh_url(p.artifact, p.file.path))
        try:
            if not _copied(fetched.get(p.file.sha256.lower()), p, progress):
                fetch_file(p.file, p.dest, progress=progress, stop=progress.stop, fresh=fresh)
        except _Stopped:
            return
        except InputError as e:
            raise InputError(f"could not fetch input {p.label}: {e}") from e
        fetched.setdefault(p.file.sha256.lower(), p.dest)


def _copied(source: Path | None, p: PlannedFile, progress: Progress) -> bool:
    """Copy ``source`` (a verified file with the same sha256) to ``p.dest``;
    False when there is none or it cannot be copied: the file is then downloaded."""
    if source is None or progress.stop.is_set():
        return False
    try:
        if source.stat().st_size != p.file.size:
            return False
        p.dest.parent.mkdir(parents=True, exist_ok=True)
        part = p.dest.with_name(p.dest.name + ".partial")
        shutil.copyfile(source, part)
        os.replace(part, p.dest)
    except OSError:
        return False
    progress.bytes += p.file.size
    return True


def fetch_file(
    f: InputFile,
    dest: Path,
    *,
    progress: Progress,
    stop: threading.Event,
    fresh: Callable[[], str] | None = None,
) -> None:
    """Download one file to ``dest`` (atomically) and verify it. Raises
    ``InputError`` with a reason that does not name the file."""
    part = dest.with_name(dest.name + ".partial")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        out = part.open("wb")
    except OSError as e:
        raise InputError(f"cannot write {dest.name}: {e.strerror or e}") from e
    state = _Download(out, progress, f.url, fresh)
    try:
        with out:
            # Retried for retry.RETRY_SECONDS after the first failure; a try
            # that got at least 1 MiB further is progress: the budget starts again.
            backoff, best = Backoff(), 0
            while True:
                try:
                    _get(f, state, stop)
                    break
                except _Retry as e:
                    if state.have >= best + CHUNK:
                        backoff.reset()
                    best = max(best, state.have)
                    pause = backoff.pause()
                    if pause is None:
                        raise InputError(str(e)) from e
                    log.warning("input download: %s (retrying in %.1fs)", e, pause)
                    if stop.wait(pause):
                        raise _Stopped from None
        if state.digest.hexdigest() != f.sha256.lower():
            raise InputError("sha256 mismatch")
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


class _Download:
    """The partial file and its running digest, kept across attempts."""

    def __init__(self, out: BinaryIO, progress: Progress, url: str, fresh: Callable[[], str] | None) -> None:
        self.out = out
        self.progress = progress
        self.digest = hashlib.sha256()
        self.have = 0
        self.url = url
        self.fresh = fresh
        self.fresh_asked = 0  # in a row, without a byte in between

    def renew_url(self, refused: HttpError) -> None:
        """Replace a URL the storage refused (403); raises ``_Retry`` to try it,
        ``InputError`` when there is no way to get one or too many were refused."""
        if self.fresh is None or self.fresh_asked >= MAX_FRESH_URLS:
            raise InputError(str(refused))
        self.fresh_asked += 1
        try:
            self.url = self.fresh()
        except HttpError as e:
            if e.recoverable:
                raise _Retry(f"asking for a fresh link: {e}") from e
            raise InputError(f"asking for a fresh link: {e}") from e
        log.info("input download: the link was refused (expired?); got a fresh one")
        raise _Retry("the link expired") from None

    def restart(self) -> None:
        self.out.seek(0)
        self.out.truncate()
        self.progress.bytes -= self.have
        self.digest = hashlib.sha256()
        self.have = 0

    def write(self, chunk: bytes) -> None:
        try:
            self.out.write(chunk)
        except OSError as e:
            raise InputError(f"cannot write: {e.strerror or e}") from e
        self.digest.update(chunk)
        self.have += len(chunk)
        self.progress.bytes += len(chunk)
        self.fresh_asked = 0


def _get(f: InputFile, state: _Download, stop: threading.Event) -> None:
    """One GET (a ranged one to resume); raises ``_Retry`` for network errors,
    5xx, 429 and a body that ended early."""
    headers = {"Range": f"bytes={state.have}-"} if 0 < state.have < f.size else {}
    try:
        resp = open_get(state.url, headers=headers, timeout=TIMEOUT)
    except HttpError as e:
        if e.recoverable:
            raise _Retry(str(e)) from e
        if e.status == 403:
            state.renew_url(e)
        if e.status == 416 and state.have:  # the range is no longer valid: start over
            state.restart()
            raise _Retry(str(e)) from e
        raise InputError(str(e)) from e
    with resp:
        if state.have and not resumes_at(resp, state.have):
            state.restart()  # the server sent the whole file again
        while True:
            if stop.is_set():
                raise _Stopped
            try:
                chunk = resp.read(CHUNK)
            except (OSError, http.client.HTTPException) as e:
                raise _Retry(f"download interrupted after {state.have} of {f.size} bytes: {e}") from e
            if not chunk:
                break
            if state.have + len(chunk) > f.size:
                raise InputError(f"size mismatch: more than the expected {f.size} bytes")
            state.write(chunk)
    if state.have < f.size:
        raise _Retry(f"download ended after {state.have} of {f.size} bytes")


def resumes_at(resp: http.client.HTTPResponse, offset: int) -> bool:
    if resp.status != 206:
        return False
    m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", "").strip())
    return m is not None and int(m.group(1)) == offset


def mb(size: int) -> str:
    mb = size / 1e6
    return f"{mb:.1f} MB" if mb < 10 else f"{mb:.0f} MB"

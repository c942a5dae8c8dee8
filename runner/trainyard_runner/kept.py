"""The files of a job whose artifacts could not be uploaded are not thrown
away with the job: its working directory (the trained model) is moved to
``<work dir>/kept/<job>.<attempt>/work`` and kept for ``--keep-failed-seconds``
(``TRAINYARD_RUNNER_KEEP_FAILED_SECONDS``, default 24 h); the job's reason
says on which host and where.

While anything is kept the runner says until when in every heartbeat
(``Heartbeat.kept_until``), and the server does not retire the idle machine
before then. ``Uploader`` tries the upload of every kept job's artifacts
again, at the runner's start and then with backoff (``RETRY_FIRST`` doubling
to ``RETRY_MAX``); once they are uploaded, or their time is up (``sweep``),
the directory is removed and the server is told (``POST
runner/jobs/<job>/kept/?attempt=N``), so the job's reason stops saying the
files are kept."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlencode

from .artifacts import ArtifactError, upload_artifacts
from .http import HttpError, post_json
from .jobuser import JobUser, isolating

log = logging.getLogger(__name__)

KEEP_SECONDS = 24 * 3600.0
KEPT_DIR, INFO_FILE = "kept", "kept.json"
RETRY_FIRST, RETRY_MAX = 30.0, 600.0  # seconds between the tries of the kept uploads


@dataclass(frozen=True)
class Kept:
    """One kept job's files: where, until when, and what to upload (its
    declared relative artifact paths, to the server at ``api_url``)."""

    dir: Path
    job: str
    attempt: int
    until: float
    artifacts: tuple[str, ...] = ()
    api_url: str = ""
    job_token: str = field(default="", repr=False)  # the attempt's (AssignJob.job_token): its calls carry it
    uid: int | None = None  # the job's own user (jobuser.py): the files are read as it, never as root
    # Another try may succeed (storage did not answer): retried, and the machine is held for it.
    retry: bool = True
    uploaded: bool = False  # uploaded; the server has still to hear it


def keep(
    work_dir: Path,
    job_dir: Path,
    *,
    job: str,
    attempt: int,
    seconds: float,
    why: str,
    artifacts: list[str] | None = None,
    api_url: str = "",
    job_token: str = "",
    uid: int | None = None,
    retry: bool = True,
) -> tuple[str, float | None]:
    """Move ``job_dir/work`` under ``work_dir/kept``; returns the sentence for
    the job's reason and the unix time the files are kept until (``("",
    None)`` when there was nothing to keep or the move failed). ``retry``:
    the upload failed because storage did not answer, so it is tried again
    (``Uploader``) and the machine held until then (``latest_until``); a
    failure that would fail again (a missing path, a refusal) is not."""
    source = job_dir / "work"
    if not source.is_dir() or seconds <= 0:
        return "", None
    target = work_dir / KEPT_DIR / f"{job}.{attempt}"
    until = time.time() + seconds
    # Absolute paths were never under the working directory: not kept, not uploaded later.
    relative = [a for a in artifacts or [] if not a.startswith("/")]
    try:
        target.mkdir(parents=True, exist_ok=True)
        _private(target, uid)
        os.replace(source, target / "work")
        info = {
            "job": job,
            "attempt": attempt,
            "until": until,
            "why": why,
            "artifacts": relative,
            "api_url": api_url,
            "job_token": job_token,
            "uid": uid,
            "retry": retry,
        }
        _write_info(target, info)
    except OSError as e:
        log.error("job %s: could not keep its files in %s: %s", job, target, e)
        return "", None
    when = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"the job's files are kept on {socket.gethostname()} in {target / 'work'} until {when}", until


def pending(work_dir: Path) -> list[Kept]:
    """Every kept job's files, oldest name first."""
    root = work_dir / KEPT_DIR
    if not root.is_dir():
        return []
    return [_read(entry) for entry in sorted(root.iterdir()) if entry.is_dir()]


def latest_until(work_dir: Path) -> float | None:
    """Until when this machine holds kept files it may still upload (None: none)."""
    return max((k.until for k in pending(work_dir) if (k.retry and k.api_url) or k.uploaded), default=None)


def sweep(work_dir: Path, *, now: float | None = None) -> list[Kept]:
    """Remove every kept directory past its time; returns those removed."""
    now = time.time() if now is None else now
    removed = []
    for kept in pending(work_dir):
        if kept.until <= now:
            shutil.rmtree(kept.dir, ignore_errors=True)
            log.info("removed the kept files of %s (their time is up)", kept.dir.name)
            removed.append(kept)
    return removed


def upload(kept: Kept, *, token: str) -> None:
    """Upload ``kept``'s artifacts as its attempt's (blocking), read as the
    job's own user as the job's upload was (a link to the runner's token
    fails); the server admits that attempt while the job is finished with
    its files kept on this machine. Raises ArtifactError or HttpError when
    they could not go up."""
    reading = JobUser(kept.uid).reading if kept.uid is not None and isolating() else _call
    reading(
        upload_artifacts,
        list(kept.artifacts),
        work=kept.dir / "work",
        job=kept.job,
        attempt=kept.attempt,
        api_url=kept.api_url,
        token=_credential(token, kept),
    )


def report(kept: Kept, outcome: str, *, token: str) -> bool:
    """Tell the server ``kept``'s files were ``uploaded`` or ``removed``
    (blocking); False when it did not answer (logged). A refusal is an
    answer: the server keeps no record of these files to correct."""
    if not kept.api_url:
        return True
    url = f"{kept.api_url.rstrip('/')}/runner/jobs/{kept.job}/kept/?{urlencode({'attempt': kept.attempt})}"
    try:
        post_json(url, {"outcome": outcome}, token=_credential(token, kept))
    except HttpError as e:
        log.warning("the server refused the news that job %s's kept files were %s: %s", kept.job, outcome, e)
        return not e.recoverable
    except OSError as e:
        log.warning("could not tell the server that job %s's kept files were %s: %s", kept.job, outcome, e)
        return False
    return True


class Uploader:
    """Tries the kept uploads again: at once, then after ``RETRY_FIRST``
    seconds doubling to ``RETRY_MAX`` while any upload fails (``wake()``
    starts a new round at once, e.g. after a job kept its files)."""

    def __init__(self, work_dir: Path, token: Callable[[], str], *, first: float = RETRY_FIRST) -> None:
        self._work_dir = work_dir
        self._token = token
        self._first = first
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        pause = self._first
        while True:
            self._wake.clear()
            failed = await _in_daemon_thread(self.round)
            pause = min(pause * 2, RETRY_MAX) if failed else self._first
            wait = pause if failed else RETRY_MAX
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
                pause = self._first
            except TimeoutError:
                pass

    def round(self) -> int:
        """Remove what is past its time, upload the rest (blocking); returns
        how many uploads failed."""
        token = self._token()
        for gone in sweep(self._work_dir):
            report(gone, "removed", token=token)
        failed = 0
        for kept in pending(self._work_dir):
            if kept.uploaded:  # only the server's word is missing: the reason it shows says "kept" until then
                failed += self._reported(kept, token)
                continue
            if not kept.api_url or not kept.retry:  # no record of where to upload, or it would fail again
                continue
            try:
                upload(kept, token=token)
            except (ArtifactError, HttpError, OSError) as e:
                if _answered(e):
                    log.warning("the kept files of job %s are not uploaded and not tried again: %s", kept.job, e)
                    _stop_retrying(kept)
                    continue
                log.warning("the kept files of job %s are still not uploaded: %s", kept.job, e)
                failed += 1
                continue
            log.info("uploaded the kept files of job %s attempt %d", kept.job, kept.attempt)
            _update(kept, uploaded=True)
            failed += self._reported(kept, token)
        return failed

    def _reported(self, kept: Kept, token: str) -> int:
        """Report an upload and remove the files once the server heard it; 1 if it did not."""
        if not report(kept, "uploaded", token=token):
            return 1
        shutil.rmtree(kept.dir, ignore_errors=True)
        return 0


async def _in_daemon_thread(work: Callable[[], int]) -> int:
    """``work()`` in a thread of its own that does not hold up the runner's
    exit (``asyncio.to_thread``'s pool is waited for at the end of
    ``asyncio.run``, and a try during an outage lasts ``--retry-seconds``)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def settle(result: int | None, error: Exception | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result or 0)

    def target() -> None:
        result, error = None, None
        try:
            result = work()
        except Exception as e:  # raised in the awaiting task
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed: the runner is exiting
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="kept-upload", daemon=True).start()
    return await done


def _private(target: Path, uid: int | None) -> None:
    """Root's, traversed only by the job's own group (as ``jobs/<job>/``):
    no other job's user reaches the kept files."""
    if uid is not None and isolating():
        os.chown(target, 0, uid)
        os.chmod(target, 0o710)
    else:
        os.chmod(target, 0o700)


def _answered(e: Exception) -> bool:
    """The server or storage answered, and refused: the same try fails again."""
    if isinstance(e, ArtifactError):
        return not e.unanswered
    return isinstance(e, HttpError) and not e.recoverable


def _stop_retrying(kept: Kept) -> None:
    """Kept until their time, not tried again: the machine is no longer held for them."""
    _update(kept, retry=False)


def _update(kept: Kept, **changes: object) -> None:
    try:
        info = json.loads((kept.dir / INFO_FILE).read_text())
        _write_info(kept.dir, {**info, **changes})
    except (OSError, ValueError) as e:
        log.error("could not record %s for job %s's kept files: %s", changes, kept.job, e)


def _write_info(target: Path, info: dict[str, object]) -> None:
    # The runner's alone (it holds the attempt's token): no job's user reads it.
    fd = os.open(target / INFO_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(info))


def _credential(token: str, kept: Kept) -> str:
    """The runner's token with the kept attempt's own, as the job's calls sent them."""
    return f"{token}.{kept.job_token}" if kept.job_token else token


def _call(fn: Callable[..., None], *args: object, **kwargs: object) -> None:
    fn(*args, **kwargs)


def _read(entry: Path) -> Kept:
    try:
        info = json.loads((entry / INFO_FILE).read_text())
        return Kept(
            dir=entry,
            job=str(info["job"]),
            attempt=int(info["attempt"]),
            until=float(info["until"]),
            artifacts=tuple(str(a) for a in info.get("artifacts", [])),
            api_url=str(info.get("api_url", "")),
            job_token=str(info.get("job_token", "")),
            uid=int(info["uid"]) if info.get("uid") is not None else None,
            retry=bool(info.get("retry", True)),
            uploaded=bool(info.get("uploaded", False)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        # No readable record (a move cut short): its own age decides, nothing to upload.
        return Kept(dir=entry, job="", attempt=0, until=entry.stat().st_mtime + KEEP_SECONDS)

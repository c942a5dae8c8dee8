"""The files of a job whose artifacts could not be uploaded are not thrown
away with the job: its working directory (the trained model) is moved to
``<work dir>/kept/<job>.<attempt>/work`` and kept for ``--keep-failed-seconds``
(``TRAINYARD_RUNNER_KEEP_FAILED_SECONDS``, default 24 h); the job's reason
says on which host and where. ``sweep`` removes what is past its time (at
the runner's start and after every job)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

KEEP_SECONDS = 24 * 3600.0
KEPT_DIR, INFO_FILE = "kept", "kept.json"


def keep(work_dir: Path, job_dir: Path, *, job: str, attempt: int, seconds: float, why: str) -> str:
    """Move ``job_dir/work`` under ``work_dir/kept``; returns the sentence for
    the job's reason ("" when there was nothing to keep or the move failed)."""
    source = job_dir / "work"
    if not source.is_dir() or seconds <= 0:
        return ""
    target = work_dir / KEPT_DIR / f"{job}.{attempt}"
    until = time.time() + seconds
    try:
        target.mkdir(parents=True, exist_ok=True)
        os.replace(source, target / "work")
        info = {"job": job, "attempt": attempt, "until": until, "why": why}
        (target / INFO_FILE).write_text(json.dumps(info))
    except OSError as e:
        log.error("job %s: could not keep its files in %s: %s", job, target, e)
        return ""
    when = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"the job's files are kept on {socket.gethostname()} in {target / 'work'} until {when}"


def sweep(work_dir: Path, *, now: float | None = None) -> list[Path]:
    """Remove every kept directory past its time; returns those removed."""
    root = work_dir / KEPT_DIR
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    removed = []
    for entry in sorted(root.iterdir()):
        try:
            until = float(json.loads((entry / INFO_FILE).read_text())["until"])
        except (OSError, ValueError, KeyError, TypeError):
            # No readable record (a move cut short): its own age decides.
            until = entry.stat().st_mtime + KEEP_SECONDS
        if until <= now:
            shutil.rmtree(entry, ignore_errors=True)
            log.info("removed the kept files of %s (their time is up)", entry.name)
            removed.append(entry)
    return removed

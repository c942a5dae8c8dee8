"""What a runner that just started finds of its predecessor's jobs in the work dir.

A job directory ``jobs/<job>/`` is taken over when its ``job.json`` is valid
and its shim (``shim.json``: pid, start time, boot id) is still that very
process, or has written its exit file (the job ended while no runner watched,
or before its final state was sent). Every other job directory is removed: a
job still preparing when its runner died (its shim never started), or one
whose shim died with the runner (``--no-jobs-outlive-runner``). The server
then ends those attempts as lost by the runner and retries them
(docs/RUNNER.md, "Re-attach after a runner restart").
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import shutil
import signal
import time
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from .job import SPEC_FILE, Resumed
from .process import EXIT_FILE, ShimRecord, killpg, sweep
from .protocol import AssignJob

log = logging.getLogger(__name__)

LOCK_FILE = "runner.lock"
LOCK_WAIT_SECONDS = 30.0  # a restart's new process waits this long for the old one to go


async def lock_work_dir(work_dir: Path, wait: float = LOCK_WAIT_SECONDS) -> IO[bytes] | None:
    """An exclusive flock on ``<work_dir>/runner.lock``, held while the
    returned file stays open (the kernel drops it when the process dies, and
    shims do not inherit it): two runner processes never follow the same
    jobs. None if another process still holds it after ``wait`` seconds."""
    f = (work_dir / LOCK_FILE).open("ab")
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() >= deadline:
                f.close()
                return None
            await asyncio.sleep(0.2)


def find_resumable(work_dir: Path) -> list[Resumed]:
    """The jobs of ``work_dir`` a new runner process takes over; removes the others."""
    jobs = work_dir / "jobs"
    if not jobs.is_dir():
        return []
    found = []
    for job_dir in sorted(p for p in jobs.iterdir() if p.is_dir()):
        resumed = _resumable(job_dir)
        if resumed is not None:
            found.append(resumed)
            continue
        shim = ShimRecord.load(job_dir)
        if shim is not None and shim.alive():  # alive but unusable (no valid job.json): nothing may run unwatched
            log.warning("job %s: its shim runs but the job cannot be rebuilt; killing it", job_dir.name)
            killpg(shim.pid, signal.SIGKILL)
        if shim is not None:  # whatever of it left the group (setsid, a double fork) goes too
            sweep(shim.mark, shim.cgroup)
        log.info("job %s: not resumable after the runner restart; removing %s", job_dir.name, job_dir)
        shutil.rmtree(job_dir, ignore_errors=True)
    return found


def _resumable(job_dir: Path) -> Resumed | None:
    shim = ShimRecord.load(job_dir)
    if shim is None or not ((job_dir / EXIT_FILE).exists() or shim.alive()):
        return None
    try:
        spec = AssignJob.model_validate_json((job_dir / SPEC_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, ValidationError):
        return None
    if spec.job != job_dir.name:
        return None
    return Resumed(spec=spec, shim=shim)

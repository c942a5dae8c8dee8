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

import logging
import shutil
import signal
from pathlib import Path

from pydantic import ValidationError

from .job import SPEC_FILE, Resumed
from .process import EXIT_FILE, ShimRecord, killpg
from .protocol import AssignJob

log = logging.getLogger(__name__)


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

"""What bounds a job's log: the cap on stored bytes, the end-of-log check and
retention (docs/RUNS.md, "Logs").

- **Cap.** A job stores at most its workspace's ``log_cap_bytes`` (else
  ``TRAINYARD_LOG_CAP_BYTES``) of output, counted as the runner shipped it
  (UTF-8). The line that would cross the cap is stored as one marker line
  instead, and every later line is acknowledged but not stored: the job runs
  on, and ``Job.log_note`` says what happened.
- **Check.** A runner's final state names how many lines its attempt shipped
  and their digest (``protocol.log_digest_add``); ``logs_check`` compares
  them with what the server received and flags the job when they differ.
- **Retention.** ``logs_prune`` deletes the lines of jobs of finished runs
  that ended more than ``TRAINYARD_LOG_RETENTION_DAYS`` ago.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone
from trainyard_runner.protocol import LogLineWire, log_digest_add, log_digest_hex

from backend.core.testhooks import file_hook_fires
from backend.runs.models import FINISHED_RUN, Attempt, Job
from backend.runs.services.logarchive import log_archive_delete
from backend.runs.services.logchunks import chunks_delete

logger = logging.getLogger(__name__)

PRUNE_JOBS_PER_PASS = 200
PRUNE_BUDGET_SECONDS = 300.0  # per call; the task's time limit is 600 s


@dataclass(frozen=True)
class Capped:
    """The part of a batch to store, and what it changes on the job."""

    lines: list[LogLineWire]  # maybe ending in the marker line; [] when everything is dropped
    stored_bytes: int  # output bytes of the kept lines (the marker not counted)
    truncated_at: int | None  # the marker's seq, when this batch reached the cap


def log_cap_of(job: Job) -> int:
    cap = job.workspace.log_cap_bytes
    return int(settings.TRAINYARD["LOG_CAP_BYTES"] if cap is None else cap)


def log_cap_apply(*, job: Job, first_seq: int, lines: list[LogLineWire], size: int) -> Capped:
    """Trim a batch of new lines (``size``: their output bytes) to the job's cap."""
    if job.log_truncated_at is not None:
        return Capped([], 0, None)
    cap = log_cap_of(job)
    if job.log_bytes + size <= cap:
        return Capped(lines, size, None)
    room, kept = cap - job.log_bytes, 0
    for _, _, text in lines:
        length = _utf8_len(text)
        if length > room:
            break
        room -= length
        kept += 1
    marker: LogLineWire = (
        lines[kept][0],
        "e",
        f"[trainyard] log limit of {human_bytes(cap)} reached; further output is dropped",
    )
    stored = cap - job.log_bytes - room
    return Capped([*lines[:kept], marker], stored, first_seq + kept)


def log_cap_note(cap: int, seq: int) -> str:
    return f"log limit of {human_bytes(cap)} reached at line {seq}: later output was not stored (the job ran on)"


# Attempt.log_digest of an attempt whose tally is not a running CRC (a sum of
# 64 hex digits, from an older runner): it cannot be continued, so it is not
# checked.
UNCHECKED = "-"


def _continuable(tally: str) -> bool:
    """Whether ``Attempt.log_digest`` is a running CRC (16 hex digits, or none yet),
    which a batch continues and a final state is checked against."""
    return len(tally) in (0, 16)


def attempt_log_received(*, job_id: str, attempt: int, count: int, parts: list[tuple[str, bytes]]) -> None:
    """Add a batch's lines to the attempt's tally: ``parts`` are its chunks'
    streams and text, in seq order. The caller holds the job's row lock, so
    the batches of an attempt are added in the order their lines are stored."""
    row = Attempt.objects.filter(job_id=job_id, number=attempt).values_list("pk", "log_lines", "log_digest").first()
    if row is None:
        return
    pk, lines, previous = row
    digest = UNCHECKED
    if _continuable(previous):
        state = int(previous or "0", 16)
        for streams, text in parts:
            state = log_digest_add(state, streams, text)
        digest = log_digest_hex(state)
    # The stall guard's last-output time rides on this write (``services.guards``).
    Attempt.objects.filter(pk=pk).update(log_lines=lines + count, log_digest=digest, last_output_at=Now())


def logs_check(*, job_id: str, attempt: int, lines: int, digest: str) -> bool:
    """Compare a runner's final count and digest with what this server
    received of the attempt; on a mismatch note it on the job (False)."""
    row = Attempt.objects.filter(job_id=job_id, number=attempt).values_list("log_lines", "log_digest").first()
    if row is None:
        return True
    received, ours = row
    if received == lines and (not _continuable(ours) or int(ours or "0", 16) == int(digest or "0", 16)):
        return True
    what = f"{received} of its {lines} lines" if received != lines else f"all {lines} lines, but some differ"
    note = f"log check failed for attempt {attempt}: the server received {what}; the stored log is incomplete"
    logger.warning("job %s: %s", job_id, note)
    job_log_note_add(job_id=job_id, note=note)
    return False


def job_log_note_add(*, job_id: str, note: str) -> None:
    with transaction.atomic():
        job = Job.objects.select_for_update().only("log_note").filter(pk=job_id).first()
        if job is None or note in job.log_note:
            return
        joined = f"{job.log_note}; {note}" if job.log_note else note
        Job.objects.filter(pk=job_id).update(log_note=joined[:1000])


def logs_prune(*, now: datetime | None = None, budget_seconds: float = PRUNE_BUDGET_SECONDS) -> int:
    """Delete the lines of jobs of finished runs that ended more than the
    retention's days ago, oldest first, in passes of PRUNE_JOBS_PER_PASS
    jobs until none is left or ``budget_seconds`` have passed (the next
    call goes on); returns how many jobs' logs were deleted."""
    days = settings.TRAINYARD["LOG_RETENTION_DAYS"]
    if days <= 0:
        return 0
    now = now or timezone.now()
    cutoff, deadline, pruned = now - timedelta(days=days), time.monotonic() + budget_seconds, 0
    while True:
        ids = list(
            Job.objects.filter(run__status__in=FINISHED_RUN, finished_at__lt=cutoff, log_pruned_at__isnull=True)
            .order_by("finished_at")
            .values_list("pk", flat=True)[:PRUNE_JOBS_PER_PASS]
        )
        for job_id in ids:
            _prune_one(str(job_id), days, now)
        pruned += len(ids)
        if len(ids) < PRUNE_JOBS_PER_PASS or time.monotonic() > deadline:
            return pruned


def dropped_for_tests() -> bool:
    """Test hook (TRAINYARD_TEST_DROP_LOG_BATCHES=<file>): each line of the
    file makes the server lose one batch it acknowledges, as a failed write
    that reported success would."""
    return file_hook_fires("TEST_DROP_LOG_BATCHES", "losing a log batch")


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def _prune_one(job_id: str, days: int, now: datetime) -> None:
    with transaction.atomic():
        job = Job.objects.select_for_update().only("log_note").filter(pk=job_id).first()
        if job is None:
            return
        log_archive_delete(job_id=job_id)
        chunks_delete(job_id)
        note = f"log deleted {days} days after the job ended (retention)"
        joined = f"{job.log_note}; {note}" if job.log_note else note
        Job.objects.filter(pk=job_id).update(log_pruned_at=now, log_note=joined[:1000])


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))

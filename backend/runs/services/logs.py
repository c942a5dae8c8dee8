"""Exactly-once storage of log lines sent at-least-once by runners.

The runner numbers each job's lines 1, 2, 3, … and resends everything above
the last acknowledged seq after a reconnect. ``Job.last_seq`` is the
watermark: a batch is trimmed to the lines above it and written as a few
chunk rows (``logchunks.py``) with one ``COPY``, and the watermark moves in
the same transaction. The job row is
locked (``SELECT … FOR UPDATE``) for the duration, so two connections of the
same runner (an old one not yet closed and its replacement) cannot both write
the same seqs, whichever web process holds them. Every line is masked
against the workspace's secrets, in its raw text, before it is stored or
streamed (``logmask.py``). The job's log cap and the tally for the
end-of-log check are applied here too (``loglimits.py``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from functools import cache, partial

from django.db import transaction
from trainyard_runner.protocol import LogLineWire, log_digest_add, may_be_cut

from backend.core.counters import log_ingested
from backend.runs.models import ACTIVE_JOB, Attempt, Job
from backend.runs.services.logchunks import Chunk, chunks_backward, chunks_of, chunks_write
from backend.runs.services.loglimits import (
    attempt_log_received,
    dropped_for_tests,
    log_cap_apply,
    log_cap_note,
    log_cap_of,
)
from backend.runs.services.logmask import Previous, joined_text, masked, needs_masking
from backend.vault.masking import MASK, Masks
from backend.vault.services import masks_for

logger = logging.getLogger(__name__)

# How far back a batch's first line of a stream looks for the line it may
# continue (the other stream can print in between).
PREVIOUS_WINDOW = 1000


@dataclass(frozen=True)
class StoredLogs:
    job_id: str
    run_id: str
    last_seq: int  # the watermark after this batch: what the runner is acked
    first_new_seq: int  # seq of new_lines[0]
    new_lines: list[LogLineWire]  # the lines this call stored (maybe none)
    frame: str = ""  # the followers' JSON frame of new_lines ("" when none)


@dataclass(frozen=True)
class PreparedLogs:
    """A batch made ready outside the database thread: its chunks and the
    followers' frame, built assuming nothing is resent and nothing is secret
    (logs_store rebuilds them in the rare case either is wrong)."""

    job_id: str
    first_seq: int
    lines: list[LogLineWire]
    chunks: list[Chunk]
    frame: str
    text: str  # the lines' raw texts joined by "\n": what masking searches
    attempt: int = 1
    size: int = 0  # bytes of output (UTF-8), against the job's log cap
    digest: int = 0  # the lines' protocol.log_digest_add terms, for the end-of-log check


# What logs_store reads of the locked job row (and of its workspace: the cap).
JOB_FIELDS = (
    "id",
    "run_id",
    "workspace_id",
    "last_seq",
    "instance_id",
    "attempt",
    "status",
    "log_bytes",
    "log_truncated_at",
    "log_note",
    "workspace__log_cap_bytes",
)


class UnknownJob(Exception):
    """The job does not exist or is not this runner's."""


def logs_prepare(*, job_id: str, first_seq: int, lines: list[LogLineWire], attempt: int = 1) -> PreparedLogs:
    """Pure CPU work, no database: safe to run in any thread."""
    text = joined_text(lines)
    chunks, frame = chunks_of(first_seq, lines, text), _frame(job_id, first_seq, lines)
    size = sum(len(c.text) for c in chunks) - len(lines)
    digest = log_digest_add(0, first_seq, ((stream, t) for _, stream, t in lines))
    return PreparedLogs(job_id, first_seq, lines, chunks, frame, text, attempt, size, digest)


def logs_store(
    *,
    job_id: str,
    instance_id: str,
    attempt: int,
    first_seq: int,
    lines: list[LogLineWire],
    prepared: PreparedLogs | None = None,
) -> StoredLogs:
    """Store the lines not stored yet, only from the job's current attempt on
    ``instance_id`` (fencing): anything else raises ``UnknownJob``.

    1. Lock the job; trim what is stored already (a resend) or answer a gap.
    2. Tally the new lines for the end-of-log check (all of them, stored or not).
    3. Apply the log cap: maybe a marker line instead, maybe nothing stored.
    4. Mask, write the chunks, move the watermark."""
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(of=("self",))
            .select_related("workspace")
            .only(*JOB_FIELDS)
            .filter(pk=job_id, instance_id=instance_id, attempt=attempt)
            .first()
        )
        if job is None:
            raise UnknownJob(job_id)
        skip = job.last_seq + 1 - first_seq
        if skip < 0:
            # A gap: lines between the watermark and first_seq never arrived.
            # Store nothing; the ack tells the runner where to resume.
            logger.warning("job %s: gap before seq %s (stored up to %s)", job_id, first_seq, job.last_seq)
            return StoredLogs(str(job.pk), str(job.run_id), job.last_seq, job.last_seq + 1, [])
        last_seq = first_seq + len(lines) - 1
        if last_seq <= job.last_seq:
            return StoredLogs(str(job.pk), str(job.run_id), job.last_seq, job.last_seq + 1, [])
        if prepared is None or skip:
            prepared = logs_prepare(job_id=job_id, first_seq=first_seq + skip, lines=lines[skip:], attempt=attempt)
        if dropped_for_tests():
            Job.objects.filter(pk=job.pk).update(last_seq=last_seq)
            return StoredLogs(str(job.pk), str(job.run_id), last_seq, last_seq + 1, [])
        attempt_log_received(job_id=job_id, attempt=attempt, count=len(prepared.lines), digest=prepared.digest)
        batch, truncated_at = _capped(job, prepared)
        if batch is not None:
            batch = _final(batch, masks_for(workspace_id=job.workspace_id), _previous(job))
            chunks_write(job_id, batch.chunks)
            transaction.on_commit(partial(log_ingested, lines=len(batch.lines), size=batch.size))
        _advance(job, attempt, last_seq, batch, truncated_at)
        if batch is None:
            return StoredLogs(str(job.pk), str(job.run_id), last_seq, last_seq + 1, [])
        return StoredLogs(str(job.pk), str(job.run_id), last_seq, batch.first_seq, batch.lines, batch.frame)


def _capped(job: Job, prepared: PreparedLogs) -> tuple[PreparedLogs | None, int | None]:
    """The batch within the job's log cap (None: nothing of it is stored),
    and the seq of the marker line when this batch reached the cap."""
    capped = log_cap_apply(job=job, first_seq=prepared.first_seq, lines=prepared.lines, size=prepared.size)
    if not capped.lines:
        return None, None
    if capped.truncated_at is None:
        return prepared, None
    again = logs_prepare(
        job_id=prepared.job_id, first_seq=prepared.first_seq, lines=capped.lines, attempt=prepared.attempt
    )
    return dataclasses.replace(again, size=capped.stored_bytes), capped.truncated_at


def _advance(job: Job, attempt: int, last_seq: int, batch: PreparedLogs | None, truncated_at: int | None) -> None:
    """Move the watermark past everything received, and count what was stored."""
    update: dict[str, object] = {"last_seq": last_seq}
    if batch is not None:
        update["log_bytes"] = job.log_bytes + batch.size
    if truncated_at is not None:
        note = log_cap_note(log_cap_of(job), truncated_at)
        update["log_truncated_at"] = truncated_at
        update["log_note"] = (f"{job.log_note}; {note}" if job.log_note else note)[:1000]
    Job.objects.filter(pk=job.pk).update(**update)
    if job.status not in ACTIVE_JOB:  # rare: lines after the final state: keep the attempt's range whole
        Attempt.objects.filter(job_id=job.pk, number=attempt).update(last_seq=last_seq)


def _final(prepared: PreparedLogs, masks: Masks, previous: Previous) -> PreparedLogs:
    """The batch to store: as prepared unless it needs masking. Secret values
    never reach storage or followers, so no reader can ever see them."""
    if not needs_masking(prepared.text, prepared.lines, masks, previous):
        return prepared
    lines = masked(prepared.lines, masks, previous)
    again = logs_prepare(job_id=prepared.job_id, first_seq=prepared.first_seq, lines=lines, attempt=prepared.attempt)
    return dataclasses.replace(again, size=prepared.size)


def _previous(job: Job) -> Previous:
    """The stored line a batch's first line of ``stream`` may continue: the
    last stored line of that stream if it may be cut, else None. A line with
    a mask in it may have been cut before masking shortened it. Read only
    when masking asks, at most once per stream and batch."""

    @cache
    def text(stream: str) -> str | None:
        found = None
        for chunk in chunks_backward(str(job.pk), after=job.last_seq - PREVIOUS_WINDOW, until=job.last_seq):
            at = chunk.streams.rfind(stream)
            if at >= 0:
                found = chunk.texts()[at]
                break
        if found is None:
            # Not within the window: unknown, so assume the careful case (a
            # cut whose end was masked) if older lines exist.
            return MASK if job.last_seq > PREVIOUS_WINDOW else None
        return found if may_be_cut(found) or MASK in found else None

    return text


def _frame(job_id: str, first_seq: int, lines: list[LogLineWire]) -> str:
    """The followers' frame, serialised once rather than by every follower."""
    numbered = [[first_seq + i, ts, stream, text] for i, (ts, stream, text) in enumerate(lines)]
    return json.dumps({"type": "logs", "job": job_id, "lines": numbered})

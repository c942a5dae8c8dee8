"""Exactly-once storage of log lines sent at-least-once by runners.

The runner numbers each job's lines 1, 2, 3, … and resends everything above
the last acknowledged seq after a reconnect. A batch arrives in the stored
form (``protocol.Logs``: the lines' text as one string, a stream letter per
line, runs of times), and is stored and fanned out as it came. ``Job.last_seq`` is the
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
from functools import cache, cached_property, partial
from typing import Any

from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from trainyard_runner.protocol import (
    LogLineWire,
    chunk_fields,
    chunk_lines,
    chunk_times,
    may_be_cut,
)

from backend.core.counters import log_ingested
from backend.runs.lifecycle.privateenv import job_masks
from backend.runs.models import ACTIVE_JOB, Attempt, Job
from backend.runs.services.logchunks import Chunk, chunks_backward, chunks_of_text, chunks_write, stamps_encode
from backend.runs.services.loglimits import (
    attempt_log_received,
    dropped_for_tests,
    log_cap_apply,
    log_cap_note,
    log_cap_of,
)
from backend.runs.services.logmask import Previous, masked, needs_masking
from backend.vault.masking import MASK, Masks

logger = logging.getLogger(__name__)

# How far back a batch's first line of a stream looks for the line it may
# continue (the other stream can print in between).
PREVIOUS_WINDOW = 1000


@dataclass(frozen=True)
class PreparedLogs:
    """A batch made ready outside the database thread, in the stored form:
    its chunks and the followers' frame, built assuming nothing is resent
    and nothing is secret (logs_store rebuilds them in the rare case either
    is wrong)."""

    job_id: str
    first_seq: int
    streams: str  # one letter per line
    times: list[tuple[int, float]]  # runs of [lines, unix time], as in protocol.Logs
    text: str  # the lines' raw texts, each followed by "\n": what masking searches
    chunks: list[Chunk]
    frame: str
    attempt: int = 1
    size: int = 0  # bytes of output (UTF-8, newlines not counted), against the job's log cap

    def __len__(self) -> int:
        return len(self.streams)

    @cached_property
    def lines(self) -> list[LogLineWire]:
        """[time, stream, text] of every line: per-line work, only for the
        rare paths (a resend's overlap, the log cap, masking) and tests."""
        return chunk_lines(self.streams, self.times, self.text)


@dataclass(frozen=True)
class StoredLogs:
    job_id: str
    run_id: str
    last_seq: int  # the watermark after this batch: what the runner is acked
    first_new_seq: int  # seq of the first line this call stored
    batch: PreparedLogs | None = None  # what this call stored (None: nothing)

    @property
    def count(self) -> int:
        return len(self.batch) if self.batch is not None else 0

    @property
    def frame(self) -> str:
        """The followers' frame of what was stored ("" when nothing was)."""
        return self.batch.frame if self.batch is not None else ""

    @property
    def new_lines(self) -> list[LogLineWire]:
        return self.batch.lines if self.batch is not None else []


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


def logs_prepare(
    *, job_id: str, first_seq: int, streams: str, times: list[tuple[int, float]], text: str, attempt: int = 1
) -> PreparedLogs:
    """A batch in the stored form (a runner's ``Logs`` frame, or several that
    continue each other). Pure CPU work, no database: safe to run in any
    thread. Nothing here runs per line in Python."""
    raw = text.encode("utf-8", "surrogatepass")
    stamps = stamps_encode(chunk_times(times))
    chunks = chunks_of_text(first_seq, streams, stamps, raw)
    frame = json.dumps(follower_frame(job_id, first_seq, streams, times, text), ensure_ascii=False)
    size = len(raw) - len(streams)
    return PreparedLogs(job_id, first_seq, streams, times, text, chunks, frame, attempt, size)


def follower_frame(
    job_id: str, first_seq: int, streams: str, times: list[tuple[int, float]], text: str
) -> dict[str, Any]:
    """What a follower of the run gets for consecutive lines of a job: the
    runner's ``Logs`` chunk as it came, less its attempt (docs/API.md)."""
    return {"type": "logs", "job": job_id, "first_seq": first_seq, "streams": streams, "times": times, "text": text}


def follower_events_joined(events: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``run.logs`` event of consecutive ones of a job (each continuing
    the one before it): their frames' fields concatenated, no line split."""
    if len(events) == 1:
        return events[0]
    frames = [json.loads(event["frame"]) for event in events]
    streams = "".join(f["streams"] for f in frames)
    times = [pair for f in frames for pair in f["times"]]
    text = "".join(f["text"] for f in frames)
    job, first = events[0]["job"], events[0]["first_seq"]
    frame = json.dumps(follower_frame(job, first, streams, times, text), ensure_ascii=False)
    return {"type": "run.logs", "job": job, "first_seq": first, "last_seq": events[-1]["last_seq"], "frame": frame}


def follower_frames(job_id: str, lines: list[tuple[int, float, str, str]]) -> list[dict[str, Any]]:
    """Follower frames of stored lines ([seq, time, stream, text] each): one
    per run of consecutive seqs (a log can have a gap: lines past its cap)."""
    frames, start = [], 0
    for i in range(1, len(lines) + 1):
        if i == len(lines) or lines[i][0] != lines[i - 1][0] + 1:
            streams, times, text = chunk_fields([(ts, stream, t) for _, ts, stream, t in lines[start:i]])
            frames.append(follower_frame(job_id, lines[start][0], streams, times, text))
            start = i
    return frames


def logs_prepare_lines(*, job_id: str, first_seq: int, lines: list[LogLineWire], attempt: int = 1) -> PreparedLogs:
    """``logs_prepare`` of lines ([time, stream, text] each)."""
    streams, times, text = chunk_fields(lines)
    return logs_prepare(job_id=job_id, first_seq=first_seq, streams=streams, times=times, text=text, attempt=attempt)


def logs_store(
    *,
    job_id: str,
    instance_id: str,
    attempt: int,
    first_seq: int = 1,
    lines: list[LogLineWire] | None = None,
    prepared: PreparedLogs | None = None,
) -> StoredLogs:
    """Store the lines not stored yet, only from the job's current attempt on
    ``instance_id`` (fencing): anything else raises ``UnknownJob``. The
    batch is ``prepared`` (the consumer's path), or ``lines`` from
    ``first_seq``.

    1. Lock the job; trim what is stored already (a resend) or answer a gap.
    2. Tally the new lines for the end-of-log check (all of them, stored or not).
    3. Apply the log cap: maybe a marker line instead, maybe nothing stored.
    4. Mask, write the chunks, move the watermark."""
    if prepared is None:
        prepared = logs_prepare_lines(job_id=job_id, first_seq=first_seq, lines=lines or [], attempt=attempt)
    first_seq, last_seq = prepared.first_seq, prepared.first_seq + len(prepared) - 1
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(of=("self",))
            .select_related("workspace")
            .only(*JOB_FIELDS)
            .annotate(
                private_env=ExpressionWrapper(Q(spec__has_key="private_env"), output_field=BooleanField()),
                has_app_token=ExpressionWrapper(Q(app_token__isnull=False), output_field=BooleanField()),
            )
            .filter(pk=job_id)
            .held_by(instance_id=instance_id, attempt=attempt)
            .first()
        )
        if job is None:
            raise UnknownJob(job_id)
        skip = job.last_seq + 1 - first_seq
        if skip < 0:
            # A gap: lines between the watermark and first_seq never arrived.
            # Store nothing; the ack tells the runner where to resume.
            logger.warning("job %s: gap before seq %s (stored up to %s)", job_id, first_seq, job.last_seq)
            return StoredLogs(str(job.pk), str(job.run_id), job.last_seq, job.last_seq + 1)
        if last_seq <= job.last_seq:
            return StoredLogs(str(job.pk), str(job.run_id), job.last_seq, job.last_seq + 1)
        if skip:  # a resend that overlaps what is stored (rare): keep the new lines only
            prepared = logs_prepare_lines(
                job_id=job_id, first_seq=first_seq + skip, lines=prepared.lines[skip:], attempt=attempt
            )
        if dropped_for_tests():
            Job.objects.filter(pk=job.pk).update(last_seq=last_seq)
            return StoredLogs(str(job.pk), str(job.run_id), last_seq, last_seq + 1)
        attempt_log_received(
            job_id=job_id, attempt=attempt, count=len(prepared), parts=[(c.streams, c.text) for c in prepared.chunks]
        )
        batch, truncated_at = _capped(job, prepared)
        if batch is not None:
            masks = job_masks(job=job, private_env=job.private_env, app_token=job.has_app_token)
            batch = _final(batch, masks, _previous(job))
            chunks_write(job_id, batch.chunks)
            transaction.on_commit(partial(log_ingested, lines=len(batch), size=batch.size))
        _advance(job, attempt, last_seq, batch, truncated_at)
        if batch is None:
            return StoredLogs(str(job.pk), str(job.run_id), last_seq, last_seq + 1)
        return StoredLogs(str(job.pk), str(job.run_id), last_seq, batch.first_seq, batch)


def _capped(job: Job, prepared: PreparedLogs) -> tuple[PreparedLogs | None, int | None]:
    """The batch within the job's log cap (None: nothing of it is stored),
    and the seq of the marker line when this batch reached the cap."""
    if job.log_truncated_at is None and job.log_bytes + prepared.size <= log_cap_of(job):
        return prepared, None  # the common case, decided without visiting the lines
    capped = log_cap_apply(job=job, first_seq=prepared.first_seq, lines=prepared.lines, size=prepared.size)
    if not capped.lines:
        return None, None
    if capped.truncated_at is None:
        return prepared, None
    again = logs_prepare_lines(
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
    if not masks or not needs_masking(prepared.text, prepared.lines, masks, previous):
        return prepared
    lines = masked(prepared.lines, masks, previous)
    again = logs_prepare_lines(
        job_id=prepared.job_id, first_seq=prepared.first_seq, lines=lines, attempt=prepared.attempt
    )
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

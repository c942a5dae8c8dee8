"""Exactly-once storage of log lines sent at-least-once by runners.

The runner numbers each job's lines 1, 2, 3, … and resends everything above
the last acknowledged seq after a reconnect. ``Job.last_seq`` is the
watermark: a batch is trimmed to the lines above it and written with one
``COPY``, and the watermark moves in the same transaction. The job row is
locked (``SELECT … FOR UPDATE``) for the duration, so two connections of the
same runner (an old one not yet closed and its replacement) cannot both write
the same seqs, whichever web process holds them. Every line is masked
against the workspace's secrets before it is stored.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from functools import lru_cache

from django.db import connection, transaction
from trainyard_runner.protocol import LogLineWire

from backend.runs.models import Job
from backend.vault.services import mask, mask_values

logger = logging.getLogger(__name__)


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
    """A batch made ready outside the database thread: the COPY text and the
    followers' frame, built assuming nothing is resent and nothing is secret
    (logs_store rebuilds them in the rare case either is wrong)."""

    job_id: str
    first_seq: int
    lines: list[LogLineWire]
    rows: str
    frame: str
    attempt: int = 1


class UnknownJob(Exception):
    """The job does not exist or is not this runner's."""


def logs_prepare(*, job_id: str, first_seq: int, lines: list[LogLineWire], attempt: int = 1) -> PreparedLogs:
    """Pure CPU work, no database: safe to run in any thread."""
    rows, frame = _rows(job_id, first_seq, lines), _frame(job_id, first_seq, lines)
    return PreparedLogs(job_id, first_seq, lines, rows, frame, attempt)


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
    ``instance_id`` (fencing): anything else raises ``UnknownJob``."""
    with transaction.atomic():
        job = (
            Job.objects.select_for_update()
            .only("id", "run_id", "workspace_id", "last_seq", "instance_id", "attempt")
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
        batch = _final(prepared, job_id, first_seq, lines, skip, mask_values(workspace_id=job.workspace_id))
        if batch.lines:
            _copy(batch.rows)
            Job.objects.filter(pk=job.pk).update(last_seq=job.last_seq + len(batch.lines))
        return StoredLogs(
            str(job.pk), str(job.run_id), job.last_seq + len(batch.lines), batch.first_seq, batch.lines, batch.frame
        )


def _final(
    prepared: PreparedLogs | None, job_id: str, first_seq: int, lines: list[LogLineWire], skip: int, secrets: list[str]
) -> PreparedLogs:
    """The batch to store: the prepared one unless lines were already stored
    (a resend after a reconnect) or contain a secret's value."""
    if prepared is not None and skip == 0 and not any(value in prepared.rows for value in secrets):
        return prepared
    new = _masked(lines[skip:], secrets)
    return logs_prepare(
        job_id=job_id, first_seq=first_seq + skip, lines=new, attempt=prepared.attempt if prepared else 1
    )


def _masked(lines: list[LogLineWire], secrets: list[str]) -> list[LogLineWire]:
    """Secret values never reach storage, so no reader can ever see them."""
    if not secrets:
        return lines
    return [(ts, stream, mask(text, secrets)) for ts, stream, text in lines]


def _copy(rows: str) -> None:
    """One COPY of a prepared text buffer: 5–10× faster than INSERT."""
    if not rows:
        return
    raw = connection.cursor().cursor  # the psycopg cursor under Django's wrapper
    with raw.copy("COPY runs_logline (job_id, seq, ts, stream, text) FROM STDIN") as copy:
        copy.write(rows)


def _rows(job_id: str, first_seq: int, lines: list[LogLineWire]) -> str:
    """COPY text format, built in one pass over the batch."""
    texts = _escaped_texts(lines)
    return "".join(
        f"{job_id}\t{first_seq + i}\t{_timestamp(ts)}\t{stream}\t{text}\n"
        for i, ((ts, stream, _), text) in enumerate(zip(lines, texts, strict=True))
    )


_SPECIAL = ("\\", "\t", "\r", "\x00")


def _escaped_texts(lines: list[LogLineWire]) -> list[str]:
    """Escape every text at once: str.replace over one joined string runs in
    C, while a per-line translate dominated the profile. Lines never contain
    a newline (the runner splits on it); if one does, fall back per line."""
    joined = "\n".join(text for _, _, text in lines)
    if joined.count("\n") != len(lines) - 1:
        return [_escape(text) for _, _, text in lines]
    if any(ch in joined for ch in _SPECIAL):
        # Not _escape: the newlines here are the separators, not text.
        joined = joined.replace("\\", "\\\\").replace("\t", "\\t").replace("\r", "\\r").replace("\x00", "\ufffd")
    return joined.split("\n")


def _escape(text: str) -> str:
    """COPY text format; Postgres text cannot hold NUL, which must not fail
    the whole batch (a binary blob on stdout)."""
    return (
        text.replace("\\", "\\\\")
        .replace("\t", "\\t")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\x00", "\ufffd")
    )


def _timestamp(ts: float) -> str:
    second = int(ts)
    return f"{_second(second)}.{int((ts - second) * 1_000_000):06d}+00"


@lru_cache(maxsize=256)
def _second(second: int) -> str:
    """Lines come in bursts within the same second: format each second once."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(second))


def _frame(job_id: str, first_seq: int, lines: list[LogLineWire]) -> str:
    """The followers' frame, serialised once rather than by every follower."""
    numbered = [[first_seq + i, ts, stream, text] for i, (ts, stream, text) in enumerate(lines)]
    return json.dumps({"type": "logs", "job": job_id, "lines": numbered})

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

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection, transaction

from backend.runs.models import Job
from backend.vault.services import mask, mask_values
from trainyard_runner.protocol import LogLineWire

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredLogs:
    job_id: str
    run_id: str
    last_seq: int  # the watermark after this batch: what the runner is acked
    first_new_seq: int  # seq of new_lines[0]
    new_lines: list[LogLineWire]  # the lines this call stored (maybe none)


class UnknownJob(Exception):
    """The job does not exist or is not this runner's."""


def logs_store(*, job_id: str, instance_id: str, first_seq: int, lines: list[LogLineWire]) -> StoredLogs:
    with transaction.atomic():
        job = (
            Job.objects.select_for_update()
            .only("id", "run_id", "workspace_id", "last_seq", "instance_id")
            .filter(pk=job_id, instance_id=instance_id)
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
        new = _masked(lines[skip:], mask_values(workspace_id=job.workspace_id))
        if new:
            _copy(str(job.pk), job.last_seq + 1, new)
            Job.objects.filter(pk=job.pk).update(last_seq=job.last_seq + len(new))
        return StoredLogs(str(job.pk), str(job.run_id), job.last_seq + len(new), job.last_seq + 1, new)


def _masked(lines: list[LogLineWire], secrets: list[str]) -> list[LogLineWire]:
    """Secret values never reach storage, so no reader can ever see them."""
    if not secrets:
        return lines
    return [(ts, stream, mask(text, secrets)) for ts, stream, text in lines]


def _copy(job_id: str, first_seq: int, lines: list[LogLineWire]) -> None:
    """One COPY of a text buffer built in a single pass: 5–10× faster than
    INSERT, and faster than psycopg's per-row write_row at these sizes."""
    rows = "".join(
        f"{job_id}\t{first_seq + i}\t{_timestamp(ts)}\t{stream}\t{_escape(text)}\n"
        for i, (ts, stream, text) in enumerate(lines)
    )
    raw = connection.cursor().cursor  # the psycopg cursor under Django's wrapper
    with raw.copy("COPY runs_logline (job_id, seq, ts, stream, text) FROM STDIN") as copy:
        copy.write(rows)


_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\x00": "\ufffd"})


def _escape(text: str) -> str:
    """COPY text format; Postgres text cannot hold NUL, which must not fail
    the whole batch (a binary blob on stdout)."""
    return text.translate(_ESCAPES)


def _timestamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()

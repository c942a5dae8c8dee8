"""Compaction, from the beat (docs/METRICS.md): the frames' rows packed
into one block per attempt and hour (system samples) or per metric
(training values), once PACK_FRAMES of them wait or their hour is over,
and the system blocks of hours older than
``TRAINYARD_METRICS_RAW_HOURS`` downsampled to min/mean/max per minute.

Each step works under the attempt's ``AttemptMetrics`` row lock, as
ingestion does, and replaces rows within one transaction: a reader sees
the old rows or the new ones. A pass is bounded (``BUCKETS_PER_PASS``);
the next one goes on.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Min, Q
from django.utils import timezone

from backend.metrics.blocks import Minutes, Samples, Values, merge_samples, minutes_of
from backend.metrics.models import AttemptMetrics, Level, SystemBlock, TrainingBlock
from backend.metrics.series import order_key

# Frames' rows younger than this wait (a late frame of the hour may come).
PACK_AFTER = timedelta(minutes=2)
# A running hour's frames are packed once this many wait (five minutes at
# 5 s), so its block is rewritten a dozen times an hour, not every minute;
# a finished hour's whatever their number.
PACK_FRAMES = 60
HOUR = timedelta(hours=1)
BUCKETS_PER_PASS = 500
PASS_BUDGET_SECONDS = 40.0
# A packed training block takes new values while it holds fewer than this.
TRAINING_BLOCK_VALUES = 8192


def metrics_compact(*, now: datetime | None = None, budget_seconds: float = PASS_BUDGET_SECONDS) -> int:
    """One pass: returns how many hours and metrics were rewritten."""
    now = now or timezone.now()
    deadline = time.monotonic() + budget_seconds
    done = 0
    raw_until = now - timedelta(hours=settings.TRAINYARD["METRICS_RAW_HOURS"]) - timedelta(hours=1)
    buckets = set(
        SystemBlock.objects.filter(level=Level.FRAME, created_at__lt=now - PACK_AFTER)
        .values("attempt_id", "bucket")
        .annotate(frames=Count("id"))
        .filter(Q(frames__gte=PACK_FRAMES) | Q(bucket__lt=now - HOUR - PACK_AFTER))
        .values_list("attempt_id", "bucket")[:BUCKETS_PER_PASS]
    )
    buckets |= set(
        SystemBlock.objects.filter(level=Level.RAW, bucket__lt=raw_until)
        .values_list("attempt_id", "bucket")
        .distinct()[:BUCKETS_PER_PASS]
    )
    for attempt_id, bucket in sorted(buckets, key=lambda pair: pair[1]):
        done += _compact_hour(str(attempt_id), bucket, downsample=bucket < raw_until)
        if time.monotonic() > deadline:
            return done
    series = (
        TrainingBlock.objects.filter(packed=False, created_at__lt=now - PACK_AFTER)
        .values("attempt_id", "name", "by_step")
        .annotate(frames=Count("id"), oldest=Min("created_at"))
        .filter(Q(frames__gte=PACK_FRAMES) | Q(oldest__lt=now - HOUR))
        .values_list("attempt_id", "name", "by_step")[:BUCKETS_PER_PASS]
    )
    for attempt_id, name, by_step in list(series):
        done += _pack_values(str(attempt_id), name, by_step)
        if time.monotonic() > deadline:
            return done
    return done


def _lock(attempt_id: str) -> bool:
    return AttemptMetrics.objects.select_for_update().filter(attempt_id=attempt_id).exists()


def _compact_hour(attempt_id: str, bucket: datetime, *, downsample: bool) -> int:
    """The hour's rows of the attempt as one: raw samples (``RAW``), or per
    minute (``MINUTES``) when ``downsample``."""
    with transaction.atomic():
        if not _lock(attempt_id):
            return 0
        rows = list(SystemBlock.objects.filter(attempt_id=attempt_id, bucket=bucket).order_by("t_first", "id"))
        if not rows or (len(rows) == 1 and rows[0].level == (Level.MINUTES if downsample else Level.RAW)):
            return 0
        minutes = [row for row in rows if row.level == Level.MINUTES]
        samples = merge_samples(
            Samples.decode(row.data, row.names, row.count) for row in rows if row.level != Level.MINUTES
        )
        first = rows[0]
        if minutes or downsample:
            earlier = minutes[0] if minutes else None
            into = Minutes.decode(earlier.data, earlier.names, earlier.count) if earlier else None
            merged = minutes_of(samples, into)
            names = sorted(merged.mean, key=order_key)
            merged.low = {n: merged.low[n] for n in names}
            merged.mean = {n: merged.mean[n] for n in names}
            merged.high = {n: merged.high[n] for n in names}
            level, count, data = Level.MINUTES, len(merged.t), merged.encode()
        else:
            names = sorted(samples.values, key=order_key)
            samples.values = {n: samples.values[n] for n in names}
            level, count, data = Level.RAW, len(samples.t), samples.encode()
        SystemBlock.objects.filter(pk__in=[row.pk for row in rows]).delete()
        SystemBlock.objects.create(
            attempt_id=first.attempt_id,
            job_id=first.job_id,
            number=first.number,
            level=level,
            bucket=bucket,
            t_first=min(row.t_first for row in rows),
            t_last=max(row.t_last for row in rows),
            count=count,
            names=names,
            data=data,
        )
    return 1


def _pack_values(attempt_id: str, name: str, by_step: bool) -> int:
    """The metric's unpacked rows of the attempt appended to its last packed
    block while it has room, else into a new one."""
    with transaction.atomic():
        if not _lock(attempt_id):
            return 0
        rows = list(
            TrainingBlock.objects.filter(attempt_id=attempt_id, name=name, by_step=by_step, packed=False).order_by(
                "t_first", "id"
            )
        )
        if not rows:
            return 0
        last = (
            TrainingBlock.objects.filter(attempt_id=attempt_id, name=name, by_step=by_step, packed=True)
            .order_by("-t_last", "-id")
            .first()
        )
        if last is not None and last.count < TRAINING_BLOCK_VALUES:
            rows.insert(0, last)
        parts = [Values.decode(row.data, row.count, by_step=by_step) for row in rows]
        keyed = sorted(
            (
                (part.step[i] if part.step is not None else part.t[i], part.t[i], part.v[i])
                for part in parts
                for i in range(len(part.t))
            ),
        )
        merged = Values(t=[t for _, t, _ in keyed], step=[int(k) for k, _, _ in keyed] if by_step else None,
                        v=[v for _, _, v in keyed])  # fmt: skip
        first = rows[0]
        TrainingBlock.objects.filter(pk__in=[row.pk for row in rows]).delete()
        TrainingBlock.objects.create(
            attempt_id=first.attempt_id,
            job_id=first.job_id,
            number=first.number,
            name=name,
            by_step=by_step,
            packed=True,
            t_first=min(row.t_first for row in rows),
            t_last=max(row.t_last for row in rows),
            count=len(keyed),
            data=merged.encode(),
        )
    return 1

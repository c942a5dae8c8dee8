"""Compaction: the frames' rows of an hour packed into one block with every
sample, hours older than the raw window downsampled to min/mean/max per
minute, training values packed per metric; what a reader gets is the same
data, and the guards' selectors still answer."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.metrics import selectors
from backend.metrics.blocks import Minutes, Samples, Values
from backend.metrics.models import Level, SystemBlock, TrainingBlock
from backend.metrics.services.compact import metrics_compact
from backend.metrics.services.ingest import record_metrics
from backend.runs.models import Run
from tests.metrics.test_ingest import _running, _sample, _value
from tests.support.attempts import current_attempt

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = 1_789_999_200.0  # an hour's start, months ago


def _feed(job: Any, instance: Any, start: float, seconds: int, every: float = 5.0) -> None:
    """Frames of 12 samples (a minute) each, two GPUs whose load follows the sample's index."""
    n = int(seconds / every)
    for first in range(0, n, 12):
        samples = [
            _sample(start + i * every, cpu=float(i % 100), gpus=[float(i % 50), 10.0])
            for i in range(first, min(n, first + 12))
        ]
        values = [_value("loss", 1.0 / (i + 1), start + i * every, step=i) for i in range(first, min(n, first + 12))]
        message = protocol.Metrics(job=str(job.pk), attempt=1, system=samples, training=values)
        assert record_metrics(instance_id=str(instance.pk), message=message)


def test_frames_are_packed_per_hour_then_downsampled_per_minute(team: Workspace, run: Run, settings: Any) -> None:
    job, instance = _running(team, run)
    _feed(job, instance, HOUR, 2 * 3600)  # two hours: 1440 samples in 120 frames
    assert SystemBlock.objects.filter(job=job, level=Level.FRAME).count() == 120
    assert TrainingBlock.objects.filter(job=job, packed=False).count() == 120
    soon = timezone.now() + timedelta(minutes=3)

    settings.TRAINYARD = {**settings.TRAINYARD, "METRICS_RAW_HOURS": 24 * 365}
    assert metrics_compact(now=soon) == 3  # two hours, one metric
    raw = list(SystemBlock.objects.filter(job=job).order_by("bucket"))
    assert [(b.level, b.count, b.bucket) for b in raw] == [
        (Level.RAW, 720, datetime.fromtimestamp(HOUR, tz=UTC)),
        (Level.RAW, 720, datetime.fromtimestamp(HOUR + 3600, tz=UTC)),
    ]
    samples = Samples.decode(raw[0].data, raw[0].names, raw[0].count)
    assert samples.t == [HOUR + 5 * i for i in range(720)]
    assert samples.values["cpu"] == [float(i % 100) for i in range(720)]
    (packed,) = TrainingBlock.objects.filter(job=job)
    values = Values.decode(packed.data, packed.count, by_step=True)
    assert (packed.packed, values.step, values.v) == (True, list(range(1440)), [1.0 / (i + 1) for i in range(1440)])
    assert metrics_compact(now=soon) == 0  # nothing left to do

    settings.TRAINYARD = {**settings.TRAINYARD, "METRICS_RAW_HOURS": 6}
    assert metrics_compact(now=soon) == 2
    minutes = list(SystemBlock.objects.filter(job=job).order_by("bucket"))
    assert [(b.level, b.count) for b in minutes] == [(Level.MINUTES, 60), (Level.MINUTES, 60)]
    first = Minutes.decode(minutes[0].data, minutes[0].names, minutes[0].count)
    assert first.t[:2] == [HOUR, HOUR + 60] and first.count[:2] == [12, 12]
    # Samples 0..11 in the first minute: cpu 0..11, gpu0 util 0..11.
    assert (first.low["cpu"][0], first.mean["cpu"][0], first.high["cpu"][0]) == (0.0, 5.5, 11.0)
    assert first.high["gpu0.util"][4] == max(i % 50 for i in range(48, 60)) == 49.0
    assert math.isclose(first.mean["gpu1.util"][30], 10.0)

    attempt = current_attempt(job)
    peak = selectors.gpu_peak_since(attempt.pk, datetime.fromtimestamp(HOUR + 3600, tz=UTC))
    assert peak is not None and peak.util == 49.0 and peak.first_at == datetime.fromtimestamp(HOUR + 3600, tz=UTC)


def test_a_late_frame_for_a_downsampled_hour_is_merged_into_its_minutes(
    team: Workspace, run: Run, settings: Any
) -> None:
    job, instance = _running(team, run)
    _feed(job, instance, HOUR, 600)
    settings.TRAINYARD = {**settings.TRAINYARD, "METRICS_RAW_HOURS": 6}
    soon = timezone.now() + timedelta(minutes=3)
    metrics_compact(now=soon)
    late = protocol.Metrics(
        job=str(job.pk), attempt=1, system=[_sample(HOUR + 600 + 5 * i, cpu=100.0) for i in range(12)]
    )
    assert record_metrics(instance_id=str(instance.pk), message=late)
    metrics_compact(now=soon + timedelta(minutes=3))
    (block,) = SystemBlock.objects.filter(job=job)
    minutes = Minutes.decode(block.data, block.names, block.count)
    assert (block.level, minutes.t[-1], minutes.count[-1], minutes.mean["cpu"][-1]) == (
        Level.MINUTES,
        HOUR + 600,
        12,
        100.0,
    )
    assert math.isnan(minutes.mean["gpu0.util"][-1])  # the late samples had no GPU


def test_a_running_hours_frames_wait_until_five_minutes_of_them_are_there(team: Workspace, run: Run) -> None:
    from backend.metrics.services.compact import PACK_FRAMES

    job, instance = _running(team, run)
    hour = math.floor(timezone.now().timestamp() / 3600) * 3600.0

    def frames(first: int, count: int) -> None:
        for i in range(first, first + count):
            message = protocol.Metrics(job=str(job.pk), attempt=1, system=[_sample(hour + i)])
            assert record_metrics(instance_id=str(instance.pk), message=message)

    soon = timezone.now() + timedelta(minutes=3)
    frames(0, PACK_FRAMES - 1)
    assert metrics_compact(now=soon) == 0
    assert SystemBlock.objects.filter(job=job, level=Level.FRAME).count() == PACK_FRAMES - 1
    frames(PACK_FRAMES - 1, 1)
    assert metrics_compact(now=soon) == 1
    (block,) = SystemBlock.objects.filter(job=job)
    assert (block.level, block.count) == (Level.RAW, PACK_FRAMES)

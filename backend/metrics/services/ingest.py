"""A runner's ``Metrics`` frames into the attempt's blocks (docs/METRICS.md).

Only the job's current attempt on the runner's own instance is listened to
(``Attempt.objects.current``): a frame of a stale attempt is dropped, never
an error to the runner. A system sample is kept only if it is later than
the attempt's last one, a training value only if its step (or, without a
step, its time) is past the attempt's last of that name: a frame sent
again after a reconnect is stored once. Each frame becomes at most one
``SystemBlock`` row per hour it covers and one ``TrainingBlock`` row per
metric; compaction (``services.compact``) packs them later.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from uuid import UUID

from django.db import transaction
from django.utils import timezone
from trainyard_runner import protocol

from backend.metrics.blocks import NAN, Samples, Values, at
from backend.metrics.models import AttemptMetrics, Level, SystemBlock, TrainingBlock
from backend.metrics.series import order_key, sample_values
from backend.runs.models import Attempt

_SYSTEM_NAME = re.compile(protocol.SYSTEM_METRIC_PATTERN)

# A runner's frames of one job are taken at FRAMES_PER_SECOND, with a burst
# of FRAME_BURST (the attempt's last frame right after a periodic one, the
# frames kept while the server was away); faster ones are dropped.
FRAMES_PER_SECOND = 1.0
FRAME_BURST = 5


def record_metrics(*, instance_id: str, message: protocol.Metrics, frames_dropped: int = 0) -> bool:
    """Store what is new in ``message`` for its attempt and add its counts
    (and ``frames_dropped``, the frames of the job the connection dropped
    before this one) to the attempt's; False when the attempt is not the
    job's current one on ``instance_id`` (nothing is stored). One frame of
    a running attempt is five statements: the fenced lock of its row, the
    blocks' inserts, the row's update, the commit."""
    try:
        job_id = str(uuid.UUID(message.job))
    except ValueError:
        return False
    current = Attempt.objects.current(job_id=job_id, number=message.attempt, instance_id=instance_id)
    with transaction.atomic():
        state = AttemptMetrics.objects.select_for_update().filter(attempt__in=current.values("pk")).first()
        if state is None:  # its first frame, or not the current attempt
            attempt_id = current.values_list("pk", flat=True).first()
            if attempt_id is None:
                return False
            state = _locked_state(attempt_id=attempt_id, job_id=job_id, number=message.attempt)
        _store(state, message, frames_dropped)
    return True


def metrics_store(*, attempt_id: UUID, job_id: str, message: protocol.Metrics, frames_dropped: int = 0) -> None:
    """The block writer: what is new in ``message`` into attempt
    ``attempt_id``'s blocks, under its row lock. The caller checked that
    the frame is the attempt's (``record_metrics``)."""
    with transaction.atomic():
        _store(_locked_state(attempt_id=attempt_id, job_id=job_id, number=message.attempt), message, frames_dropped)


def _store(state: AttemptMetrics, message: protocol.Metrics, frames_dropped: int) -> None:
    _store_samples(state, message.system)
    _store_values(state, message.training)
    state.dropped += message.dropped
    state.malformed += message.malformed
    state.frames_dropped += frames_dropped
    state.save(update_fields=STATE_FIELDS)


STATE_FIELDS = [
    "dropped", "malformed", "frames_dropped", "repeated", "system_names", "training_names", "last", "marks",
    "last_sample_at", "last_value_at", "updated_at",
]  # fmt: skip


def _locked_state(*, attempt_id: UUID, job_id: str, number: int) -> AttemptMetrics:
    state: AttemptMetrics | None = AttemptMetrics.objects.select_for_update().filter(attempt_id=attempt_id).first()
    if state is None:
        AttemptMetrics.objects.bulk_create(
            [AttemptMetrics(attempt_id=attempt_id, job_id=job_id, number=number)], ignore_conflicts=True
        )
        state = AttemptMetrics.objects.select_for_update().get(attempt_id=attempt_id)
    return state


def _store_samples(state: AttemptMetrics, samples: list[protocol.SystemSample]) -> None:
    after = state.last_sample_at.timestamp() if state.last_sample_at else -math.inf
    fresh = sorted({s.t: s for s in samples if s.t > after}.values(), key=lambda s: s.t)
    state.repeated += len(samples) - len(fresh)
    if not fresh:
        return
    hours: dict[float, list[dict[str, float]]] = {}
    times: dict[float, list[float]] = {}
    for sample in fresh:
        hour = math.floor(sample.t / 3600) * 3600.0
        hours.setdefault(hour, []).append(sample_values(sample))
        times.setdefault(hour, []).append(sample.t)
    names = set(state.system_names)
    blocks = []
    for hour, rows in hours.items():
        these = sorted({name for row in rows for name in row}, key=order_key)
        names.update(these)
        block = Samples(t=times[hour], values={name: [row.get(name, NAN) for row in rows] for name in these})
        blocks.append(
            SystemBlock(
                attempt_id=state.attempt_id,
                job_id=state.job_id,
                number=state.number,
                level=Level.FRAME,
                bucket=at(hour),
                t_first=at(block.t[0]),
                t_last=at(block.t[-1]),
                count=len(block.t),
                names=these,
                data=block.encode(),
            )
        )
    SystemBlock.objects.bulk_create(blocks)
    if len(names) != len(state.system_names):
        state.system_names = sorted(names, key=order_key)
    latest = fresh[-1]
    for name, value in sample_values(latest).items():
        if not math.isnan(value):
            state.last[name] = {"value": value, "step": None, "t": latest.t}
    state.last_sample_at = at(latest.t)


def _store_values(state: AttemptMetrics, values: list[protocol.TrainingValue]) -> None:
    groups: dict[tuple[str, bool], list[protocol.TrainingValue]] = {}
    for value in values:
        if _SYSTEM_NAME.match(value.name):
            state.dropped += 1  # a system series' name: never a training metric's
            continue
        groups.setdefault((value.name, value.step is not None), []).append(value)
    blocks, stored = [], 0
    for (name, by_step), group in groups.items():
        key: Callable[[protocol.TrainingValue], float] = (lambda v: float(v.step or 0)) if by_step else (lambda v: v.t)
        marks = state.marks.setdefault(name, {})
        mark = marks.get("step" if by_step else "t", -math.inf)
        kept: list[protocol.TrainingValue] = []
        for value in sorted(group, key=key):
            if key(value) > mark:
                kept.append(value)
                mark = key(value)
        state.repeated += len(group) - len(kept)
        if not kept:
            continue
        marks["step" if by_step else "t"] = mark
        block = Values(
            t=[v.t for v in kept], step=[v.step or 0 for v in kept] if by_step else None, v=[v.value for v in kept]
        )
        blocks.append(
            TrainingBlock(
                attempt_id=state.attempt_id,
                job_id=state.job_id,
                number=state.number,
                name=name,
                by_step=by_step,
                t_first=at(min(block.t)),
                t_last=at(max(block.t)),
                count=len(kept),
                data=block.encode(),
            )
        )
        # Values read together share a time: of those, the last in key order (the highest step) is the newest.
        newest = max(kept, key=lambda v: (v.t, key(v)))
        if newest.t >= state.last.get(name, {}).get("t", -math.inf):
            state.last[name] = {"value": newest.value, "step": newest.step, "t": newest.t}
        if name not in state.training_names:
            state.training_names = [*state.training_names, name]
        stored += len(kept)
    TrainingBlock.objects.bulk_create(blocks)
    if stored:
        state.last_value_at = timezone.now()


class FrameCap:
    """One connection's rate cap on metrics frames, per job: FRAMES_PER_SECOND
    with a burst of FRAME_BURST (a token bucket). A frame over it is
    dropped and counted; the count goes with the job's next frame taken
    (``take_dropped``). It remembers the jobs of a runner (MAX_HELD_JOBS at
    most, the least recent forgotten first)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._jobs: OrderedDict[str, list[float]] = OrderedDict()  # job -> [tokens, at, dropped]

    def admit(self, job: str) -> bool:
        now = self._clock()
        entry = self._jobs.get(job)
        if entry is None:
            entry = self._jobs[job] = [float(FRAME_BURST), now, 0.0]
            while len(self._jobs) > protocol.MAX_HELD_JOBS:
                self._jobs.popitem(last=False)
        self._jobs.move_to_end(job)
        entry[0] = min(float(FRAME_BURST), entry[0] + (now - entry[1]) * FRAMES_PER_SECOND)
        entry[1] = now
        if entry[0] < 1:
            entry[2] += 1
            return False
        entry[0] -= 1
        return True

    def drop(self, job: str) -> None:
        """A frame of ``job`` dropped for another reason (the queue is full)."""
        if job in self._jobs:
            self._jobs[job][2] += 1

    def take_dropped(self, job: str) -> int:
        entry = self._jobs.get(job)
        if entry is None:
            return 0
        dropped, entry[2] = int(entry[2]), 0.0
        return dropped

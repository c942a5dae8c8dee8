"""Issue 35: a runner's Metrics frames over its real websocket into the
attempt's blocks (real consumer, real Postgres): samples and training values
stored per attempt, a stale attempt's frame dropped without an error to the
runner, a resend stored once, frames past the rate cap dropped and counted,
the attempt's last frame stored before its end, and the guards' selectors."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import Instance
from backend.metrics import selectors
from backend.metrics.blocks import Samples, Values
from backend.metrics.models import AttemptMetrics, SystemBlock, TrainingBlock
from backend.runs.models import Attempt, AttemptStatus, Job, Run
from backend.runs.scheduler.passes import jobs_schedule
from tests.runs.test_fencing import _moved_to_another_runner
from tests.support.attempts import accept, current_attempt
from tests.support.runners import HELLO, runner_instance, runner_socket

pytestmark = pytest.mark.django_db(transaction=True)

T0 = 1_790_000_000.0  # a Unix time well inside one hour


def _sample(t: float, cpu: float = 50.0, rss: int = 1 << 20, gpus: list[float] | None = None) -> protocol.SystemSample:
    return protocol.SystemSample(
        t=t,
        cpu=cpu,
        rss=rss,
        disk_used=10,
        disk_total=100,
        gpus=[
            protocol.GpuSample(index=i, util=u, mem_used=i << 30, mem_total=16 << 30, power_w=100.0)
            for i, u in enumerate(gpus or [])
        ],
    )


def _value(name: str, value: float, t: float, step: int | None = None) -> protocol.TrainingValue:
    return protocol.TrainingValue(name=name, value=value, step=step, t=t, source="log")


def _running(team: Workspace, run: Run, name: str = "r1") -> tuple[Job, Instance]:
    instance = runner_instance(team, name, f"{name}-secret", channel_name=f"chan-{name}")
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)
    return job, instance


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await database_sync_to_async(check)():
        assert time.monotonic() < deadline, "timed out waiting for the metrics to be stored"
        await asyncio.sleep(0.05)


def _send(
    token: str, job: Job, attempt: int, frames: list[str | float], *, then: Callable[[], bool] | None = None
) -> list[Any]:
    """Connect as the runner holding ``job``'s attempt, send ``frames`` (a
    number: wait that many seconds), wait until ``then()`` holds; return
    every frame the server sent after its welcome."""
    lease = Attempt.objects.get(job=job, number=attempt).lease
    held = protocol.HeldJob(job=str(job.pk), attempt=attempt, lease=lease, confirmed=True)

    async def scenario() -> list[Any]:
        ws = runner_socket(token)
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_copy(update={"running_jobs": [held]}).model_dump_json())
        await ws.receive_from(timeout=5)  # welcome
        for frame in frames:
            if isinstance(frame, float):
                await asyncio.sleep(frame)
            else:
                await ws.send_to(text_data=frame)
        if then is not None:
            await _until(then)
        answers = []
        while not await ws.receive_nothing(timeout=0.3):
            answers.append(json.loads(await ws.receive_from(timeout=1)))
        await ws.disconnect()
        return answers

    return async_to_sync(scenario)()


def _metrics(job: Job, attempt: int, **fields: Any) -> str:
    return protocol.Metrics(job=str(job.pk), attempt=attempt, **fields).model_dump_json()


def _samples_of(job: Job) -> list[tuple[int, float, dict[str, float]]]:
    out = []
    for block in SystemBlock.objects.filter(job=job).order_by("t_first"):
        samples = Samples.decode(block.data, block.names, block.count)
        for i, t in enumerate(samples.t):
            out.append((block.number, t, {name: samples.values[name][i] for name in samples.values}))
    return out


def _values_of(job: Job, name: str) -> list[tuple[int, int | None, float]]:
    out = []
    for block in TrainingBlock.objects.filter(job=job, name=name).order_by("t_first"):
        values = Values.decode(block.data, block.count, by_step=block.by_step)
        for i, v in enumerate(values.v):
            out.append((block.number, values.step[i] if values.step is not None else None, v))
    return out


def test_a_running_attempts_samples_and_values_are_stored_and_read_by_the_guards(team: Workspace, run: Run) -> None:
    job, _ = _running(team, run)
    frame = _metrics(
        job,
        1,
        system=[_sample(T0 + 5 * i, cpu=95.0 + i, rss=(100 + i) << 20, gpus=[3.0 + i, 40.0]) for i in range(3)],
        training=[_value("loss", 1.0 / (s + 1), T0 + s, step=s) for s in range(4)],
        dropped=7,
        malformed=2,
    )
    answers = _send("r1-secret", job, 1, [frame], then=lambda: AttemptMetrics.objects.filter(job=job).exists())

    assert answers == []  # metrics are not acknowledged
    samples = _samples_of(job)
    assert [(n, t) for n, t, _ in samples] == [(1, T0), (1, T0 + 5), (1, T0 + 10)]
    assert [s["cpu"] for _, _, s in samples] == [95.0, 96.0, 97.0]
    assert [s["memory"] for _, _, s in samples] == [100 << 20, 101 << 20, 102 << 20]
    assert [s["gpu0.util"] for _, _, s in samples] == [3.0, 4.0, 5.0]
    assert [s["gpu1.memory"] for _, _, s in samples] == [float(1 << 30)] * 3
    assert _values_of(job, "loss") == [(1, s, 1.0 / (s + 1)) for s in range(4)]
    state = AttemptMetrics.objects.get(job=job)
    assert (state.dropped, state.malformed, state.frames_dropped, state.repeated) == (7, 2, 0, 0)
    assert state.system_names[:6] == ["cpu", "memory", "disk_used", "disk_total", "net_rx", "net_tx"]
    assert state.training_names == ["loss"]
    assert state.last["loss"] == {"value": 0.25, "step": 3, "t": T0 + 3}
    assert state.last["cpu"]["value"] == 97.0

    attempt = current_attempt(job)
    assert selectors.last_sample_at(attempt.pk) == datetime.fromtimestamp(T0 + 10, tz=UTC)
    assert selectors.last_training_value_at(attempt.pk) is not None
    peak = selectors.gpu_peak_since(attempt.pk, datetime.fromtimestamp(T0 + 1, tz=UTC))
    assert peak is not None and (peak.util, peak.first_at, peak.last_at) == (
        40.0,
        datetime.fromtimestamp(T0 + 5, tz=UTC),
        datetime.fromtimestamp(T0 + 10, tz=UTC),
    )
    assert selectors.gpu_peak_since(attempt.pk, datetime.fromtimestamp(T0 + 11, tz=UTC)) is None


def test_without_gpus_there_is_no_gpu_series_and_no_peak(team: Workspace, run: Run) -> None:
    job, _ = _running(team, run)
    frame = _metrics(job, 1, system=[_sample(T0), _sample(T0 + 5)])
    _send("r1-secret", job, 1, [frame], then=lambda: SystemBlock.objects.filter(job=job).exists())
    state = AttemptMetrics.objects.get(job=job)
    assert state.system_names == ["cpu", "memory", "disk_used", "disk_total", "net_rx", "net_tx"]
    assert selectors.gpu_peak_since(current_attempt(job).pk, datetime.fromtimestamp(T0 - 60, tz=UTC)) is None


def test_a_resent_frame_is_stored_once_and_counted(team: Workspace, run: Run) -> None:
    job, _ = _running(team, run)
    frame = _metrics(job, 1, system=[_sample(T0)], training=[_value("loss", 0.5, T0, step=1), _value("lr", 0.1, T0)])
    later = _metrics(job, 1, system=[_sample(T0), _sample(T0 + 5)], training=[_value("loss", 0.4, T0 + 5, step=2)])
    _send(
        "r1-secret",
        job,
        1,
        [frame, frame, later],
        then=lambda: AttemptMetrics.objects.filter(job=job, repeated__gte=4).exists(),
    )
    assert [t for _, t, _ in _samples_of(job)] == [T0, T0 + 5]
    assert _values_of(job, "loss") == [(1, 1, 0.5), (1, 2, 0.4)]
    assert _values_of(job, "lr") == [(1, None, 0.1)]
    assert AttemptMetrics.objects.get(job=job).repeated == 4  # the second frame's 3, the later one's first sample


def test_a_stale_attempts_frame_is_dropped_without_an_error_and_attempts_are_kept_apart(
    team: Workspace, run: Run
) -> None:
    job, _old, _new = _moved_to_another_runner(team, run)
    stale = _metrics(job, 1, system=[_sample(T0)], training=[_value("loss", 9.0, T0, step=1)])
    answers = _send("old-secret", job, 1, [stale])
    assert [a["type"] for a in answers] == []  # no refusal for a metrics frame
    assert not SystemBlock.objects.filter(job=job).exists()

    second = _metrics(job, 2, system=[_sample(T0 + 60)], training=[_value("loss", 0.2, T0 + 60, step=10)])
    _send("new-secret", job, 2, [second], then=lambda: SystemBlock.objects.filter(job=job).exists())
    assert [(n, t) for n, t, _ in _samples_of(job)] == [(2, T0 + 60)]
    assert _values_of(job, "loss") == [(2, 10, 0.2)]
    assert list(AttemptMetrics.objects.filter(job=job).values_list("number", flat=True)) == [2]


def test_frames_faster_than_the_cap_are_dropped_and_counted_with_the_next_frame_taken(
    team: Workspace, run: Run
) -> None:
    from backend.metrics.services.ingest import FRAME_BURST

    job, _ = _running(team, run)
    burst: list[str | float] = [_metrics(job, 1, system=[_sample(T0 + i)]) for i in range(FRAME_BURST + 3)]
    after = _metrics(job, 1, system=[_sample(T0 + 100)])
    _send(
        "r1-secret",
        job,
        1,
        [*burst, 1.2, after],
        then=lambda: AttemptMetrics.objects.filter(
            job=job, last_sample_at__gte=datetime.fromtimestamp(T0 + 100, tz=UTC)
        ).exists(),
    )
    assert [t for _, t, _ in _samples_of(job)] == [T0 + i for i in range(FRAME_BURST)] + [T0 + 100]
    assert AttemptMetrics.objects.get(job=job).frames_dropped == 3


def test_the_cap_reports_its_drops_with_the_next_frame_taken() -> None:
    from backend.metrics.services.ingest import FRAME_BURST, FrameCap

    now = [0.0]
    cap = FrameCap(clock=lambda: now[0])
    taken = [cap.admit("j") for _ in range(FRAME_BURST + 3)]
    assert taken == [True] * FRAME_BURST + [False] * 3
    assert cap.admit("other")  # each job its own
    now[0] += 1.0
    assert cap.admit("j") and cap.take_dropped("j") == 3 and cap.take_dropped("j") == 0
    assert not cap.admit("j")  # one a second once the burst is spent
    now[0] += 10.0
    assert [cap.admit("j") for _ in range(FRAME_BURST + 1)] == [True] * FRAME_BURST + [False]


def test_the_attempts_last_frame_is_stored_before_its_end(team: Workspace, run: Run) -> None:
    job, _ = _running(team, run)
    last = _metrics(job, 1, training=[_value("loss", 0.01, T0 + 100, step=100)])
    final = protocol.JobState(job=str(job.pk), attempt=1, state="succeeded", exit_code=0).model_dump_json()
    _send(
        "r1-secret",
        job,
        1,
        [last, final],
        then=lambda: Attempt.objects.filter(job=job, status=AttemptStatus.ENDED).exists(),
    )
    assert _values_of(job, "loss") == [(1, 100, 0.01)]


def test_a_training_value_named_as_a_system_series_is_not_stored(team: Workspace, run: Run) -> None:
    job, _ = _running(team, run)
    frame = _metrics(job, 1, training=[_value("cpu", 1.0, T0), _value("gpu0.util", 1.0, T0), _value("acc", 0.9, T0)])
    _send("r1-secret", job, 1, [frame], then=lambda: TrainingBlock.objects.filter(job=job).exists())
    state = AttemptMetrics.objects.get(job=job)
    assert (state.training_names, state.dropped) == (["acc"], 2)


def test_a_sample_hour_boundary_splits_the_frame_into_one_block_an_hour(team: Workspace, run: Run) -> None:
    job, _ = _running(team, run)
    hour = (T0 // 3600 + 1) * 3600
    frame = _metrics(job, 1, system=[_sample(hour - 5), _sample(hour), _sample(hour + 5)])
    _send("r1-secret", job, 1, [frame], then=lambda: SystemBlock.objects.filter(job=job).count() == 2)
    assert sorted(SystemBlock.objects.filter(job=job).values_list("count", flat=True)) == [1, 2]
    assert [t for _, t, _ in _samples_of(job)] == [hour - 5, hour, hour + 5]
    assert selectors.last_sample_at(current_attempt(job).pk) == datetime.fromtimestamp(hour + 5, tz=UTC)

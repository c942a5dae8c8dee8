"""A job attempt's metrics (docs/METRICS.md, docs/RUNNER.md "Metrics"):
system samples of its process tree, its working directory's filesystem, the
machine's network and GPUs every ``AssignJob.metrics_interval`` seconds, and
training values read off its log lines (``AssignJob.metrics``) and from the
JSON lines it appends to ``$TRAINYARD_METRICS_FILE``.

The rules it keeps:

- Training values are admitted at most ``metrics_per_minute`` a minute (a
  window that restarts every 60 s); the rest are counted in
  ``Metrics.dropped``, as are values that find the buffer full.
- A metric's values without a step are keyed by their time, so each one's
  time is later than the one before of that metric (``TIME_STEP`` later
  where lines read together had the same): the server keeps one value per
  time.
- What waits to be sent is bounded by one frame: the latest
  ``MAX_SYSTEM_SAMPLES`` samples (older ones make room) and the first
  ``MAX_TRAINING_VALUES`` values (later ones are counted as dropped). So a
  runner cut off from the server keeps the last ten minutes of samples and
  sends them after the reconnect.
- A frame is due at most every ``FRAME_SECONDS``; the attempt's last one
  (``final``) once the commands ended and the metrics file was read to its
  end, at least ``END_GAP`` after the previous one (the server drops a job's
  frames that come faster than one a second).
- Nothing here fails a job: a metrics file line that is not a JSON object
  of numbers is skipped and counted (``Metrics.malformed``), a sampler that
  cannot read something leaves it out of the sample.

Sampling reads ``/proc`` (``psutil``) and the GPUs in a worker thread; the
event loop only files the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import shutil
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from . import protocol as p
from .jobuser import JobUser

log = logging.getLogger(__name__)

METRICS_FILE_VAR = "TRAINYARD_METRICS_FILE"
METRICS_DIR, METRICS_FILE = "metrics", "metrics.jsonl"  # <job dir>/metrics/metrics.jsonl, the job's own
FRAME_SECONDS = 5.0  # a Metrics frame at most this often while the job runs
END_GAP = 1.1  # the attempt's last frame comes at least this long after the previous one
FIRST_SAMPLE_SECONDS = 1.0  # the first sample, so that a short job has one too
FILE_POLL_SECONDS = 1.0  # how often the metrics file is looked at for new lines
MAX_SEARCH_CHARS = 4096  # a log line's first characters that the patterns are searched in
MAX_FILE_LINE_BYTES = 64 * 1024  # a longer metrics file line is malformed
READ_CHUNK = 1 << 20  # bytes of the metrics file read per look while the job runs
SMI_TIMEOUT = 10.0
TIME_STEP = 0.001  # the times of one metric's values without a step are this far apart at least
# Keys of a metrics file line that key the value rather than being one.
KEY_FIELDS = ("step", "time", "timestamp")
# A "time"/"timestamp" of a metrics file line is taken as the value's unix
# time when it is one (after 2001, not ahead of the clock by more than a
# minute); otherwise (seconds since the start, say) the time it was read.
_EARLIEST_TIME = 1e9
_NAME = re.compile(p.METRIC_NAME_PATTERN)
_SYSTEM = re.compile(p.SYSTEM_METRIC_PATTERN)
SMI_QUERY = "index,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"
MIB = 1024 * 1024


# ---------------------------------------------------------------- environment


def job_metrics_env(job_id: str) -> dict[str, str]:
    """What a job's experiment trackers read to continue one run across the
    job's attempts: W&B's run id (the job id: stable across attempts, new
    for every run of a workflow) and ``WANDB_RESUME=allow``. A job's own
    setting of either wins (the caller puts the job's variables over these).
    MLflow gets nothing: ``MLFLOW_RUN_ID`` must name a run that exists, and
    MLflow makes its run ids itself (docs/decisions/0105-metrics-runner.md)."""
    return {"WANDB_RUN_ID": job_id.replace("-", "").lower()[:64], "WANDB_RESUME": "allow"}


# ---------------------------------------------------------------- GPUs


class Gpus:
    """The machine's GPUs, read through NVML (``nvidia-ml-py``) where it
    imports and initialises, else ``nvidia-smi``, else none (no GPU series,
    no error). Which one is decided at the first read."""

    def __init__(self) -> None:
        self._way: str | None = None  # "nvml", "smi" or "none"
        self._warned = False

    @property
    def way(self) -> str | None:
        return self._way

    def read(self) -> list[p.GpuSample]:
        """Every GPU now (blocking: call it in a worker thread)."""
        if self._way is None:
            self._way = "nvml" if _nvml_ready() else "smi" if shutil.which("nvidia-smi") else "none"
            log.info("GPU sampling: %s", {"nvml": "NVML", "smi": "nvidia-smi", "none": "no GPU found"}[self._way])
        try:
            if self._way == "nvml":
                return _nvml_read()
            if self._way == "smi":
                return _smi_read()
        except Exception as e:  # a driver hiccup: this sample has no GPUs, the next one tries again
            if not self._warned:
                log.warning("reading the GPUs failed (%s): samples leave them out until it works", e)
                self._warned = True
        return []


def _nvml_ready() -> bool:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # not installed, or no driver (libnvidia-ml.so) on this machine
        return False
    return True


def _nvml_read() -> list[p.GpuSample]:
    import pynvml

    out = []
    for index in range(min(pynvml.nvmlDeviceGetCount(), p.MAX_GPUS)):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        power_mw = _nvml_optional(pynvml.nvmlDeviceGetPowerUsage, handle)
        out.append(
            p.GpuSample(
                index=index,
                util=min(100.0, float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
                mem_used=int(memory.used),
                mem_total=int(memory.total),
                power_w=power_mw / 1000 if power_mw is not None else None,
                temp_c=_nvml_optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            )
        )
    return out


def _nvml_optional(read: Callable[..., Any], *args: Any) -> float | None:
    """A reading a GPU may not support (power, temperature): None then."""
    import pynvml

    try:
        return float(read(*args))
    except pynvml.NVMLError:
        return None


def _smi_read() -> list[p.GpuSample]:
    import subprocess

    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=SMI_TIMEOUT,
        check=True,
    ).stdout
    return parse_smi_samples(out)


def parse_smi_samples(out: str) -> list[p.GpuSample]:
    """``nvidia-smi``'s answer to the sampling query, one GPU a line. A GPU
    whose utilisation or memory is not a number ("[N/A]") is left out; a
    power or temperature that is not one is None."""
    result = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 6:
            continue
        index, util, used, total = (_number(f) for f in fields[:4])
        if index is None or util is None or used is None or total is None or not 0 <= index < p.MAX_GPUS:
            continue
        result.append(
            p.GpuSample(
                index=int(index),
                util=min(max(util, 0.0), 100.0),
                mem_used=max(int(used * MIB), 0),
                mem_total=max(int(total * MIB), 0),
                power_w=_nonnegative(_number(fields[4])),
                temp_c=_number(fields[5]),
            )
        )
    return result[: p.MAX_GPUS]


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _nonnegative(value: float | None) -> float | None:
    return value if value is not None and value >= 0 else None


# ---------------------------------------------------------------- the process tree


class TreeSampler:
    """CPU and resident memory of a job's processes: every descendant of its
    shim (the shim is their subreaper, so a process that left the group is
    still one), plus what the shim's reaped children used. CPU is the time
    the tree spent since the previous sample over the wall time between
    them, in percent of one core; a tree that lost a process to elsewhere
    reads 0, never negative."""

    def __init__(self, shim_pid: int) -> None:
        self._pid = shim_pid
        self._last: tuple[float, float] | None = None  # (monotonic, cpu seconds)

    def sample(self) -> tuple[float, int]:
        """(cpu %, rss bytes) now; the first call only sets the baseline (0 %)."""
        now = time.monotonic()
        cpu_seconds, rss = self._read()
        last, self._last = self._last, (now, cpu_seconds)
        if last is None or now <= last[0]:
            return 0.0, rss
        percent = (cpu_seconds - last[1]) / (now - last[0]) * 100
        return min(max(percent, 0.0), 100_000.0), rss

    def _read(self) -> tuple[float, int]:
        try:
            shim = psutil.Process(self._pid)
            times = shim.cpu_times()
            children = shim.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return (self._last[1] if self._last else 0.0), 0
        total = times.children_user + times.children_system
        rss = 0
        for proc in children:
            try:
                with proc.oneshot():
                    t = proc.cpu_times()
                    rss += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += t.user + t.system + t.children_user + t.children_system
        return total, rss


class NetSampler:
    """The machine's network rate (bytes per second, every interface but
    loopback) since the previous sample; 0 at the first."""

    def __init__(self) -> None:
        self._last: tuple[float, int, int] | None = None

    def sample(self) -> tuple[float, float]:
        now = time.monotonic()
        try:
            counters = psutil.net_io_counters(pernic=True)
        except OSError:
            return 0.0, 0.0
        rx = sum(c.bytes_recv for name, c in counters.items() if name != "lo")
        tx = sum(c.bytes_sent for name, c in counters.items() if name != "lo")
        last, self._last = self._last, (now, rx, tx)
        if last is None or now <= last[0]:
            return 0.0, 0.0
        seconds = now - last[0]
        return max(rx - last[1], 0) / seconds, max(tx - last[2], 0) / seconds


# ---------------------------------------------------------------- training values


class LogPatterns:
    """``AssignJob.metrics`` compiled: each searched in every log line's
    first ``MAX_SEARCH_CHARS`` characters. A pattern that does not compile
    here (the server checked it) is left out with a warning."""

    def __init__(self, patterns: list[p.MetricPattern]) -> None:
        self.compiled: list[tuple[str, re.Pattern[str]]] = []
        for pattern in patterns:
            try:
                regex = re.compile(pattern.regex)
            except re.error as e:
                log.warning("metric %s: its regex does not compile here (%s): not read", pattern.name, e)
                continue
            if regex.groups:
                self.compiled.append((pattern.name, regex))

    def values(self, texts: list[str], t: float) -> list[p.TrainingValue]:
        out = []
        for text in texts:
            text = text[:MAX_SEARCH_CHARS]
            for name, regex in self.compiled:
                match = regex.search(text)
                if match is None:
                    continue
                groups = regex.groupindex
                raw = match.group("value") if "value" in groups else match.group(1)
                value = _number(raw) if raw is not None else None
                if value is None:
                    continue
                step = _step(match.group("step")) if "step" in groups else None
                out.append(p.TrainingValue(name=name, value=value, step=step, t=t, source="log"))
        return out


def _step(raw: object) -> int | None:
    """A step: a non-negative integer (``12``, ``12.0``, ``"12"``); else None."""
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, str):
        raw = _number(raw)
        if raw is None:
            return None
    if isinstance(raw, int):
        return raw if raw >= 0 else None
    if isinstance(raw, float) and math.isfinite(raw) and raw.is_integer() and raw >= 0:
        return int(raw)
    return None


def parse_file_line(raw: bytes, read_at: float) -> list[p.TrainingValue] | None:
    """The values of one metrics file line; None when it is malformed: not a
    JSON object, a ``step`` that is not a non-negative integer, a number under
    a name that is no metric name (or a system metric's), or no number at all.
    Keys whose values are not numbers (a phase, a note) are ignored."""
    if len(raw) > MAX_FILE_LINE_BYTES:
        return None
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(line, dict):
        return None
    step = None
    if "step" in line:
        step = _step(line["step"])
        if step is None:
            return None
    t = read_at
    for key in ("time", "timestamp"):
        when = line.get(key)
        if isinstance(when, int | float) and not isinstance(when, bool) and _EARLIEST_TIME <= when <= read_at + 60:
            t = float(when)
            break
    values = []
    for name, value in line.items():
        if name in KEY_FIELDS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not _NAME.match(name) or _SYSTEM.match(name) or not math.isfinite(value):
            return None
        values.append(p.TrainingValue(name=name, value=float(value), step=step, t=t, source="file"))
    return values or None


class FileTail:
    """Reads the metrics file's complete lines as the job appends them;
    ``rest`` reads to its end, the last line also without its newline. It
    is opened with the job's user's file access (a link to what that user
    may not read is not followed), and opened again when the job replaced
    it. Blocking: call it in a worker thread."""

    def __init__(self, path: Path, user: JobUser | None) -> None:
        self.path = path
        self._user = user
        self._file: Any = None
        self._inode: int | None = None
        self._partial = b""

    def lines(self, *, to_end: bool = False) -> list[bytes]:
        if self._user is not None:
            return self._user.reading(self._lines, to_end)
        return self._lines(to_end)

    def _lines(self, to_end: bool) -> list[bytes]:
        self._reopen()
        if self._file is None:
            return []
        out: list[bytes] = []
        while True:
            chunk = self._file.read(READ_CHUNK)
            if not chunk:
                break
            data = self._partial + chunk
            cut = data.rfind(b"\n") + 1
            out += data[: cut - 1].split(b"\n") if cut else []
            self._partial = data[cut:]
            if len(self._partial) > MAX_FILE_LINE_BYTES:  # one endless line: malformed, skipped to its end
                out.append(self._partial)
                self._partial = b""
            if not to_end:
                break
        if to_end and self._partial:
            out.append(self._partial)
            self._partial = b""
        return [line for line in out if line.strip()]

    def _reopen(self) -> None:
        try:
            inode = os.stat(self.path, follow_symlinks=False).st_ino
        except OSError:
            return
        if inode == self._inode:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return
        with contextlib.suppress(OSError):
            if self._file is not None:
                self._file.close()
        self._file = os.fdopen(fd, "rb", buffering=0)
        self._inode = inode
        self._partial = b""

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


# ---------------------------------------------------------------- one attempt


class JobMetrics:
    """One attempt's metrics between its commands' start (``start``) and end
    (``finish``); the agent takes its frames (``frame``, ``sent``)."""

    def __init__(
        self,
        spec: p.AssignJob,
        *,
        metrics_file: Path,
        work: Path,
        user: JobUser | None = None,
        gpus: Gpus | None = None,
    ) -> None:
        self.job = spec.job
        self.attempt = spec.attempt
        self.interval = spec.metrics_interval
        self._per_minute = spec.metrics_per_minute
        self._patterns = LogPatterns(spec.metrics)
        self._work = work
        self._gpus = gpus or Gpus()
        self._net = NetSampler()
        self._tree: TreeSampler | None = None
        self._tail = FileTail(metrics_file, user)
        self._system: deque[p.SystemSample] = deque(maxlen=p.MAX_SYSTEM_SAMPLES)
        self._training: list[p.TrainingValue] = []
        self._dropped = 0
        self._malformed = 0
        self._window_start = time.monotonic()
        self._in_window = 0
        self._last_t: dict[str, float] = {}  # per metric, the time of its latest value without a step
        self._last_frame = 0.0  # monotonic time the previous frame was handed out
        self._tasks: list[asyncio.Task[None]] = []
        self.finished = False  # the commands ended and the file was read to its end
        self.abandoned = False  # the server takes nothing more of this attempt

    # ------------------------------------------------------------ producers

    def start(self, shim_pid: int) -> None:
        """Sample the tree under ``shim_pid`` and follow the metrics file until ``finish``."""
        self._tree = TreeSampler(shim_pid)
        self._tasks = [asyncio.create_task(self._sampling()), asyncio.create_task(self._tailing())]

    def lines(self, texts: list[str]) -> None:
        """Log lines the job printed (both streams): the patterns' values;
        also after ``finish``: the log's last lines are read after the
        commands exit, and their values go in the attempt's last frame."""
        if self._patterns.compiled:
            self._add(self._patterns.values(texts, round(time.time(), 3)))

    async def finish(self) -> None:
        """The commands ended: stop sampling, read the metrics file to its end."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            self._file_lines(await asyncio.to_thread(self._tail.lines, to_end=True))
        self._tail.close()
        self.finished = True

    def abandon(self) -> None:
        """Nothing more of this attempt is wanted: drop what waits, take nothing more."""
        self.abandoned = True
        self._system.clear()
        self._training.clear()
        self._dropped = self._malformed = 0
        for task in self._tasks:
            task.cancel()

    async def _sampling(self) -> None:
        assert self._tree is not None
        await asyncio.to_thread(self._tree.sample)  # the baselines
        await asyncio.to_thread(self._net.sample)
        delay = min(FIRST_SAMPLE_SECONDS, self.interval)
        while True:
            await asyncio.sleep(delay)
            delay = self.interval
            try:
                sample = await asyncio.to_thread(self.sample)
            except Exception:
                log.exception("job %s: sampling failed", self.job)
                continue
            if not self.abandoned:
                self._system.append(sample)

    def sample(self) -> p.SystemSample:
        """One system sample now (blocking)."""
        assert self._tree is not None
        cpu, rss = self._tree.sample()
        rx, tx = self._net.sample()
        try:
            disk = shutil.disk_usage(self._work)
            used, total = disk.used, disk.total
        except OSError:
            used = total = 0
        return p.SystemSample(
            t=round(time.time(), 3),
            cpu=round(cpu, 2),
            rss=rss,
            disk_used=used,
            disk_total=total,
            net_rx=round(rx, 1),
            net_tx=round(tx, 1),
            gpus=self._gpus.read(),
        )

    async def _tailing(self) -> None:
        while True:
            await asyncio.sleep(FILE_POLL_SECONDS)
            try:
                self._file_lines(await asyncio.to_thread(self._tail.lines))
            except Exception:
                log.exception("job %s: reading its metrics file failed", self.job)

    def _file_lines(self, lines: list[bytes]) -> None:
        read_at = round(time.time(), 3)
        for raw in lines:
            values = parse_file_line(raw, read_at)
            if values is None:
                self._malformed += 1
            else:
                self._add(values)

    def _add(self, values: list[p.TrainingValue]) -> None:
        if self.abandoned or not values:
            return
        now = time.monotonic()
        if now - self._window_start >= 60:
            self._window_start, self._in_window = now, 0
        room = max(0, min(self._per_minute - self._in_window, p.MAX_TRAINING_VALUES - len(self._training)))
        taken = [self._keyed(v) for v in values[:room]]
        self._training += taken
        self._in_window += len(taken)
        self._dropped += len(values) - len(taken)

    def _keyed(self, value: p.TrainingValue) -> p.TrainingValue:
        """``value`` with a time of its own when it has no step (see the module's rules)."""
        if value.step is not None:
            return value
        last = self._last_t.get(value.name)
        if last is not None and value.t <= last:
            value = value.model_copy(update={"t": round(last + TIME_STEP, 3)})
        self._last_t[value.name] = value.t
        return value

    # ------------------------------------------------------------ the agent's side

    def frame(self, *, final: bool = False) -> p.Metrics | None:
        """The frame that is due now, or None. ``final``: the attempt's last
        one, due once ``END_GAP`` passed since the previous (call it after
        ``finish``); otherwise due ``FRAME_SECONDS`` after the previous.
        Nothing is taken off until ``sent``."""
        if self.abandoned:
            return None
        if not (self._system or self._training or self._dropped or self._malformed):
            return None
        if time.monotonic() - self._last_frame < (END_GAP if final else FRAME_SECONDS):
            return None
        return p.Metrics(
            job=self.job,
            attempt=self.attempt,
            system=list(self._system),
            training=list(self._training),
            dropped=self._dropped,
            malformed=self._malformed,
        )

    def seconds_until_final(self) -> float:
        """How long the last frame must wait for ``END_GAP``."""
        return max(0.0, self._last_frame + END_GAP - time.monotonic())

    def sent(self, frame: p.Metrics) -> None:
        """``frame`` reached the socket: take what it carried off."""
        self._last_frame = time.monotonic()
        if frame.system:
            last = frame.system[-1].t
            while self._system and self._system[0].t <= last:
                self._system.popleft()
        del self._training[: len(frame.training)]
        self._dropped -= frame.dropped
        self._malformed -= frame.malformed

    def pending(self) -> bool:
        return not self.abandoned and bool(self._system or self._training or self._dropped or self._malformed)

"""Simulated runners for part ``metrics`` of ``make bench`` (bench/README.md):
lightweight clients of the real runner protocol, many to a process.

Each simulated runner is a self-hosted runner of the bench's workspace (its
own runner token, registered through the API). It opens the runner socket
as ``trainyard-runner`` does, says ``Hello`` (a machine of 8 GPUs), answers
``AssignJob`` with ``JobAccepted`` and, once confirmed, reports ``running``
and plays its job: LINES_PER_S log lines a second, evenly spaced (the line
is its own read, as a training loop's progress line is), batched and
windowed by the runner's own rule (``logstream``: a batch goes at once when
nothing is in flight, else once its oldest line waited BATCH_DELAY; at most
WINDOW batches unacknowledged); one ``Metrics`` frame every METRICS_EVERY
seconds holding one system sample with its GPUS GPUs and the training
values of the lines that carried a loss; a ``Heartbeat`` every
``Welcome.heartbeat_seconds``. Nothing runs: the job is played, so the
load on the server is that of the protocol alone.

The jobs start printing together, once every runner's job runs (the
load in its steady state, not while 500 jobs are being placed). When told
to stop, each one drains (waits for the acks of every line sent),
sends a last ``Metrics`` frame and the final ``JobState`` (succeeded, with
its line count), and closes. A connection the server closes is a result
(its code and reason are counted), not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from trainyard_runner import protocol
from trainyard_runner.agent import ACK_TIMEOUT
from trainyard_runner.logstream import BATCH_DELAY, WINDOW

LINES_PER_S = 10
LOSS_EVERY = 10  # one line in ten carries the loss: a training value a second
METRICS_EVERY = 5.0
GPUS = 8
GIB = 1 << 30
HELLO_TIMEOUT = 60.0
DRAIN_TIMEOUT = 20.0
REPORT_EVERY = 0.25
COUNTED = ("running", "log_frames", "lines", "metrics_frames", "heartbeats")


def hello_frame(name: str) -> str:
    gpu = protocol.Gpu(name="NVIDIA H100 80GB HBM3", memory_bytes=80 * GIB)
    hello = protocol.Hello(
        version="bench",
        hostname=name,
        address="127.0.0.1",
        resources=protocol.Resources(cpus=64, memory_bytes=512 * GIB, disk_bytes=4000 * GIB, gpus=[gpu] * GPUS),
    )
    return hello.model_dump_json()


@dataclass
class Counters:
    """What one client process saw of its runners."""

    connected: int = 0
    assigned: int = 0
    running: int = 0
    finished: int = 0
    log_frames: int = 0
    lines: int = 0
    metrics_frames: int = 0
    heartbeats: int = 0
    refused: int = 0
    # Times a runner had lines in flight and no ack for ACK_TIMEOUT: a real
    # runner takes the connection for dead there and reconnects.
    ack_timeouts: int = 0
    ack_ms: list[float] = field(default_factory=list)
    closes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in COUNTED}

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "ack_ms"}
        out["acks"] = len(self.ack_ms)
        out["ack_ms"] = self.ack_ms[:: max(1, len(self.ack_ms) // 20_000)]  # a sample, to pool across processes
        return out


class SimulatedRunner:
    """One runner connection and the one job the server gives it."""

    def __init__(
        self,
        url: str,
        token: str,
        name: str,
        counters: Counters,
        stop: asyncio.Event,
        *,
        go: asyncio.Event,
        metrics: bool,
    ) -> None:
        self.url, self.token, self.name, self.metrics = url, token, name, metrics
        self.c, self.stop, self.go = counters, stop, go
        self.job: str | None = None
        self.attempt = 0
        self.seq_base = self.seq = self.acked = 0
        self.pending: list[tuple[float, str, str]] = []
        self.in_flight: list[tuple[int, float]] = []  # (last seq, sent at)
        self.losses: list[dict[str, Any]] = []
        self.wake = asyncio.Event()
        self.confirmed = asyncio.Event()
        self.heartbeat_seconds = 2.0
        self.last_ack_at = 0.0
        self.timed_out = False
        self.ws: Any = None

    async def run(self, ready: asyncio.Event) -> None:
        from websockets.asyncio.client import connect

        try:
            async with connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self.token}"},
                open_timeout=HELLO_TIMEOUT,
                close_timeout=5,
                max_size=16 << 20,
                user_agent_header="trainyard-bench-runner",
            ) as ws:
                self.ws = ws
                await ws.send(hello_frame(self.name))
                welcome = json.loads(await asyncio.wait_for(ws.recv(), HELLO_TIMEOUT))
                if welcome.get("type") != "welcome":
                    raise RuntimeError(f"expected welcome, got {welcome.get('type')}")
                self.heartbeat_seconds = float(welcome["heartbeat_seconds"])
                self.c.connected += 1
                ready.set()
                tasks = [asyncio.create_task(t) for t in (self._receive(), self._heartbeats(), self._job())]
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in tasks:
                    task.cancel()
                for task in done:
                    if task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
        except Exception as error:
            code = getattr(getattr(error, "rcvd", None), "code", None)
            if code is not None:
                self.c.closes.append(f"{code} {getattr(error.rcvd, 'reason', '')}"[:160])  # type: ignore[attr-defined]
            else:
                self.c.errors.append(f"{type(error).__name__}: {error}"[:200])
        finally:
            ready.set()

    async def _send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(frame, separators=(",", ":")))

    async def _receive(self) -> None:
        async for raw in self.ws:
            frame = json.loads(raw)
            kind = frame.get("type")
            if kind == "assign_job":
                self.job, self.attempt, self.seq_base = frame["job"], frame["attempt"], frame["seq_base"]
                self.seq = self.acked = self.seq_base
                self.c.assigned += 1
                await self._send(
                    {"type": "job_accepted", "job": self.job, "attempt": self.attempt, "lease": frame["lease"]}
                )
            elif kind == "job_confirmed" and frame["job"] == self.job:
                self.confirmed.set()
            elif kind == "log_ack" and frame["job"] == self.job:
                now = time.time()
                self.last_ack_at, self.timed_out = now, False
                self.acked = max(self.acked, frame["seq"])
                while self.in_flight and self.in_flight[0][0] <= self.acked:
                    self.c.ack_ms.append((now - self.in_flight.pop(0)[1]) * 1000)
                self.wake.set()
            elif kind in ("refused", "cancel_job"):
                self.c.refused += 1
                self.job = None
                return
        if not self.stop.is_set():
            raise RuntimeError("the server closed the connection")

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            await self._send({"type": "heartbeat", "state": "busy" if self.job else "idle"})
            self.c.heartbeats += 1
            if self.in_flight and not self.timed_out and time.time() - self.last_ack_at > ACK_TIMEOUT:
                self.timed_out = True
                self.c.ack_timeouts += 1

    async def _job(self) -> None:
        """Once confirmed: running, then the job's lines and metrics until told to stop."""
        stop = asyncio.create_task(self.stop.wait())
        confirmed = asyncio.create_task(self.confirmed.wait())
        await asyncio.wait([stop, confirmed], return_when=asyncio.FIRST_COMPLETED)
        if not self.confirmed.is_set() or self.job is None:
            await asyncio.sleep(0.5)
            return
        await self._send({"type": "job_state", "job": self.job, "attempt": self.attempt, "state": "running"})
        self.c.running += 1
        # Every runner's job starts printing together, once all of them run: the
        # load is measured in its steady state, not while the jobs are being placed.
        await asyncio.wait([asyncio.create_task(self.go.wait()), stop], return_when=asyncio.FIRST_COMPLETED)
        sender = asyncio.create_task(self._sender())
        metrics = asyncio.create_task(self._metrics() if self.metrics else asyncio.sleep(0))
        step = 0
        # Spread the runners' lines over the interval: they did not start in step.
        next_at = time.monotonic() + random.random() / LINES_PER_S
        while not self.stop.is_set() and self.job is not None:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += 1 / LINES_PER_S
            step += 1
            now = time.time()
            if step % LOSS_EVERY == 0:
                loss = 2.5 * math.exp(-step / 5000) + random.random() * 0.01
                text = f"step {step} loss {loss:.4f} lr 3.0e-04 tokens/s 51234"
                self.losses.append({"name": "loss", "value": round(loss, 4), "step": step, "t": now, "source": "log"})
            else:
                text = f"step {step} batch {step % 97} data 0.012s fwd 0.081s bwd 0.163s"
            self.pending.append((now, "o", text))
            self.wake.set()
        await self._drain()
        sender.cancel()
        metrics.cancel()
        if self.job is None:
            return
        if self.metrics:
            await self._send_metrics()
        await self._send(
            {
                "type": "job_state",
                "job": self.job,
                "attempt": self.attempt,
                "state": "succeeded",
                "exit_code": 0,
                "log_lines": self.seq - self.seq_base,
            }
        )
        self.c.finished += 1
        await asyncio.sleep(1.0)  # the server's answer (if any) before the close

    async def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while (self.pending or self.acked < self.seq) and time.monotonic() < deadline and self.job is not None:
            self.wake.set()
            await asyncio.sleep(0.05)
        if self.acked < self.seq:
            self.c.errors.append(f"{self.name}: {self.seq - self.acked} lines not acknowledged after the drain")

    async def _sender(self) -> None:
        """logstream's rule: at once when nothing is in flight, else after
        BATCH_DELAY for company; never more than WINDOW batches in flight."""
        from websockets.exceptions import ConnectionClosed

        with contextlib.suppress(ConnectionClosed):  # counted where the connection's end is read
            await self._send_batches()

    async def _send_batches(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            if not self.pending or len(self.in_flight) >= WINDOW or self.job is None:
                continue
            if self.in_flight:
                delay = self.pending[0][0] + BATCH_DELAY - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if len(self.in_flight) >= WINDOW:
                    continue
            lines, self.pending = self.pending, []
            streams, times, text = protocol.chunk_fields(lines)
            frame = {
                "type": "logs",
                "job": self.job,
                "attempt": self.attempt,
                "first_seq": self.seq + 1,
                "streams": streams,
                "times": times,
                "text": text,
            }
            self.seq += len(lines)
            if not self.in_flight:
                self.last_ack_at = time.time()  # the ack clock runs from here
            self.in_flight.append((self.seq, time.time()))
            await self._send(frame)
            self.c.log_frames += 1
            self.c.lines += len(lines)
            if self.pending:
                self.wake.set()

    async def _metrics(self) -> None:
        from websockets.exceptions import ConnectionClosed

        await asyncio.sleep(random.random() * METRICS_EVERY)
        with contextlib.suppress(ConnectionClosed):  # counted where the connection's end is read
            while True:
                await self._send_metrics()
                await asyncio.sleep(METRICS_EVERY)

    async def _send_metrics(self) -> None:
        now = time.time()
        gpus = [
            {
                "index": i,
                "util": round(random.uniform(85, 100), 1),
                "mem_used": 71 * GIB + random.randrange(GIB),
                "mem_total": 80 * GIB,
                "power_w": round(random.uniform(550, 700), 1),
                "temp_c": round(random.uniform(60, 75), 1),
            }
            for i in range(GPUS)
        ]
        sample = {
            "t": now,
            "cpu": round(random.uniform(95, 105), 1),
            "rss": 24 * GIB + random.randrange(GIB),
            "disk_used": 800 * GIB,
            "disk_total": 4000 * GIB,
            "net_rx": 1.2e6,
            "net_tx": 3.4e5,
            "gpus": gpus,
        }
        values, self.losses = self.losses, []
        frame = {"type": "metrics", "job": self.job, "attempt": self.attempt, "system": [sample], "training": values}
        await self._send(frame)
        self.c.metrics_frames += 1


def client_process(url: str, runners: list[tuple[str, str]], events: Any, go: Any, stop: Any, metrics: bool) -> None:
    """In its own process: ``runners`` ((token, name) each) connected; their
    jobs, once running, print from when ``go`` is set until ``stop`` is
    (multiprocessing Events). Puts ("connected", n) once every runner said
    hello, ("counts", {...}) every REPORT_EVERY seconds and ("done",
    summary) at the end on ``events`` (each after the process's pid).
    ``metrics`` False: no ``Metrics`` frames (a server that does not take
    them)."""

    async def main() -> None:
        counters = Counters()
        stopping, going = asyncio.Event(), asyncio.Event()
        sims = [
            SimulatedRunner(url, token, name, counters, stopping, go=going, metrics=metrics) for token, name in runners
        ]
        readies = [asyncio.Event() for _ in sims]
        tasks = []
        for sim, ready in zip(sims, readies, strict=True):
            tasks.append(asyncio.create_task(sim.run(ready)))
            await asyncio.sleep(0.005)  # a connect burst, not a stampede in one tick
        for ready in readies:
            await ready.wait()
        events.put((os.getpid(), "connected", counters.connected))
        while not stop.is_set():
            if go.is_set():
                going.set()
            events.put((os.getpid(), "counts", counters.counts()))
            await asyncio.sleep(REPORT_EVERY)
        stopping.set()
        await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT + 15)
        events.put((os.getpid(), "done", counters.summary()))

    asyncio.run(main())


def pooled_ack_ms(summaries: list[dict[str, Any]]) -> dict[str, float | None]:
    from bench.lib import percentile

    acks = [ms for s in summaries for ms in s["ack_ms"]]
    if not acks:
        return {"p50": None, "p99": None}
    return {"p50": round(statistics.median(acks), 1), "p99": round(percentile(acks, 99), 1)}

"""Trainyard scaled out: two web processes and two Celery workers (and beat)
against one Postgres and one Redis, behind haproxy (deploy/haproxy.cfg), with
a local runner that connects through the balancer, as a real one would.

A follower on one web process sees, live, the lines a runner streams to the
other; the web process the runner is attached to dies (SIGKILL) and the
runner carries on through the other with every line kept once, in order; a
worker dies (SIGKILL) and every submission around it still runs.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.e2e.conftest import FINISHED, User, commit_all, make_repo, run_name_of
from tests.support.balanced import WEBS, BalancedStack, balanced_stack
from tests.support.frames import frame_lines

TICKER = """
import os, sys, time
for i in range(1, int(os.environ["TICKS"]) + 1):
    print(f"tick {i}", flush=True)
    time.sleep(float(os.environ["TICK_SECONDS"]))
"""
WORKFLOW = """
  - name: ticker
    provider: bash
    commands:
      - python ticker.py
    env:
      TICKS: "{ticks}"
      TICK_SECONDS: "0.05"
"""
# A line reaches a follower on the other web process within this long of
# being printed. The follower's own catch-up from the database (its re-check,
# set to a minute below) would take far longer: only the channel layer is this quick.
LIVE_SECONDS = 2.0
TICKS = 120


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BalancedStack]:
    """The suite's Postgres (a database of its own) and a Redis of its own
    (it must not share queues with the session's stack)."""
    with balanced_stack(
        tmp_path_factory.mktemp("scale-out"),
        "scaled",
        TRAINYARD_HEARTBEAT_SECONDS="1",
        TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS="5",
        TRAINYARD_RECONCILE_SECONDS="1",
        # One runner: haproxy's count of websockets per web process is then the runner's.
        TRAINYARD_LOCAL_RUNNERS_MAX="1",
        TRAINYARD_WS_RECHECK_SECONDS="60",
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def alice(scaled: BalancedStack) -> User:
    return User("alice", scaled.issue_token("alice"), scaled)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = make_repo(tmp_path / "tiny-train")
    (path / "ticker.py").write_text(TICKER)
    workflows = path / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + WORKFLOW.format(ticks=TICKS))
    commit_all(path, "a ticker")
    return path


def test_a_follower_on_one_web_process_sees_live_what_the_runner_streams_to_the_other(
    scaled: BalancedStack, alice: User, repo: Path
) -> None:
    name = run_name_of(alice.cli(repo, "run", "ticker", "-d"))
    attached = _runner_web(scaled)
    other = _other(attached)

    with Follower(scaled.web_ws_url(other), alice, name) as follower:
        run = alice.wait(name, lambda r: r["status"] in FINISHED, timeout=60)
        follower.wait_for(lambda: follower.finished, what="the run's end on the follower")

    assert run["status"] == "succeeded", run
    assert _runner_web(scaled) == attached  # the runner streamed to one process all along
    assert follower.texts() == [f"tick {i}" for i in range(1, TICKS + 1)]
    # Not the first frame: it may be the backlog, read from the database at connect.
    live = [line for line in follower.lines if line.frame > 0 and line.latency < LIVE_SECONDS]
    assert len(live) >= TICKS // 2, f"only {len(live)} of {TICKS} lines reached the other web process live"


def test_the_runners_web_process_killed_it_carries_on_through_the_other_with_nothing_lost(
    scaled: BalancedStack, alice: User, repo: Path
) -> None:
    name = run_name_of(alice.cli(repo, "run", "ticker", "-d"))
    attached = _runner_web(scaled)
    survivor = _other(attached)
    try:
        with Follower(scaled.web_ws_url(survivor), alice, name) as follower:
            follower.wait_for(lambda: len(follower.lines) >= 20, what="20 lines on the follower")
            scaled.stop(attached, sig=signal.SIGKILL)
            _until(lambda: not scaled.servers_up()[attached], what=f"haproxy's health check to take {attached} out")
            run = alice.wait(name, lambda r: r["status"] in FINISHED, timeout=60)
            follower.wait_for(lambda: follower.finished, what="the run's end on the follower")
        assert _runner_web(scaled) == survivor
    finally:
        if not scaled.running(attached):
            scaled.start(attached)

    assert run["status"] == "succeeded", run
    expected = [f"tick {i}" for i in range(1, TICKS + 1)]
    assert follower.texts() == expected
    printed = alice.cli(repo, "logs", name)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == expected


def test_a_worker_killed_loses_no_scheduling(scaled: BalancedStack, alice: User, repo: Path) -> None:
    """worker-1 dies while runs are being submitted (their scheduling passes in
    flight on either worker, or not yet started), and more runs come after."""
    existing = len(alice.runs())
    around: list[str] = []
    submitting = threading.Thread(target=lambda: around.extend(_submit(alice, repo, "hello", 3)))
    submitting.start()
    try:
        _until(lambda: len(alice.runs()) > existing, what="the first run of the burst")
        scaled.stop("worker-1", sig=signal.SIGKILL)  # not started again: worker-2 carries on alone
    finally:
        submitting.join(timeout=60)
    after = _submit(alice, repo, "hello", 2)
    runs = [alice.wait(name, lambda r: r["status"] in FINISHED, timeout=60) for name in around + after]

    assert len(runs) == 5
    assert [r["status"] for r in runs] == ["succeeded"] * 5, runs


# ------------------------------------------------------------------ helpers


def _runner_web(stack: BalancedStack, timeout: float = 30) -> str:
    """The web process holding the (only) runner's websocket, per haproxy."""
    deadline = time.monotonic() + timeout
    while True:
        counts = stack.websockets_on()
        holding = [web for web, count in counts.items() if count == 1]
        if sum(counts.values()) == 1 and len(holding) == 1:
            return holding[0]
        assert time.monotonic() < deadline, f"not one runner connection through the balancer: {counts}"
        time.sleep(0.1)


def _submit(user: User, repo: Path, workflow: str, count: int) -> list[str]:
    """``count`` runs submitted at once (each `trainyard run` is a process of its own)."""
    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(lambda _: run_name_of(user.cli(repo, "run", workflow, "-d")), range(count)))


def _until(condition: Callable[[], bool], *, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _other(web: str) -> str:
    [other] = [name for name in WEBS if name != web]
    return other


@dataclass
class Line:
    seq: int
    text: str
    frame: int  # of the logs frames the follower received, 0 first
    latency: float  # arrival at the follower minus the runner's timestamp


@dataclass
class Follower:
    """A websocket client following one run on one web process (not through
    the balancer), in a thread of its own."""

    ws_url: str
    user: User
    run: str
    lines: list[Line] = field(default_factory=list)
    frames: int = 0
    finished: bool = False
    error: BaseException | None = None

    def __enter__(self) -> Follower:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._follow()), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def texts(self) -> list[str]:
        return [line.text for line in self.lines]

    def wait_for(self, condition: Callable[[], bool], *, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.error is None, f"the follower failed: {self.error!r}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}; follower has {len(self.lines)} lines"
            time.sleep(0.05)

    async def _follow(self) -> None:
        url = f"{self.ws_url}/ws/v1/workspaces/{self.user.workspace}/runs/{self.run}/"
        headers = {"Authorization": f"Bearer {self.user.token}"}
        try:
            async with websockets.connect(url, additional_headers=headers) as ws:
                while not self._stop.is_set():
                    try:
                        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout=0.2))
                    except TimeoutError:
                        continue
                    self._take(frame)
        except Exception as exc:  # reported by wait_for
            self.error = exc

    def _take(self, frame: dict[str, Any]) -> None:
        now = time.time()
        if frame["type"] == "logs":
            self.lines += [Line(seq, text, self.frames, now - ts) for seq, ts, _stream, text in frame_lines(frame)]
            self.frames += 1
        elif frame["type"] == "run":
            self.finished = frame["run"]["status"] in FINISHED

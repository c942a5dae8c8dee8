"""Riding out outages (issue 7, item 7), end to end with real processes.

A job prints one line a second for 90 s while part of the control plane goes
away: (a) the web process is frozen (SIGSTOP) for 60 s, (b) the
Redis-compatible server is killed and started again 30 s later, (c) Postgres
is restarted. Each time the run succeeds on its first attempt (an outage
costs nothing, not even a retry), its stored log holds lines 1..90 exactly
once and in order, and no runner process is left behind.

This module runs its own stack on its own embedded Postgres and Valkey (each
its own ``EmbeddedServices``, so either can be stopped alone), so killing
them disturbs no other test. The unreachable grace is short (20 s, shorter
than every outage): if the server counted the silence of a runner it could
not hear, the runner would be fenced and the job retried, and the
one-attempt assertion fails.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from trainyard_runner.agent import BACKOFF_MAX
from websockets.sync.client import connect

from backend.embedded.services import EmbeddedServices
from tests.e2e.conftest import FINISHED, User, make_repo, run_name_of
from tests.support.frames import frame_lines
from tests.support.stack import Stack, reported

pytestmark = pytest.mark.slow

LINES = 90
TICKER = f"""workflows:
  - name: ticker
    provider: bash
    commands:
      - for i in $(seq 1 {LINES}); do echo "line $i"; sleep 1; done
"""
# Lines stored before the outage starts: the job is well under way.
STORED_BEFORE_OUTAGE = 3
RUNNERS_GONE_TIMEOUT = 60.0


@dataclass
class Servers:
    postgres: EmbeddedServices
    valkey: EmbeddedServices

    def valkey_kill(self) -> None:
        """SIGKILL valkey-server (no shutdown, no final fsync), then forget it."""
        pid = int((self.valkey.data_dir / "valkey" / "valkey-server.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        self.valkey.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = tmp_path_factory.mktemp("outage-servers")
    postgres = EmbeddedServices(data_dir=root / "postgres", valkey=False)
    valkey = EmbeddedServices(data_dir=root / "valkey", postgres=False, valkey_port=_free_port())
    try:
        postgres.start()
        valkey.start()
        yield Servers(postgres=postgres, valkey=valkey)
    finally:
        valkey.stop()
        postgres.stop()


@pytest.fixture(scope="module")
def outage_stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    assert servers.postgres.urls.database_url and servers.valkey.urls.redis_url
    stack = Stack(
        database_url=servers.postgres.urls.database_url,
        redis_url=servers.valkey.urls.redis_url,
        data_dir=tmp_path_factory.mktemp("outage-stack"),
    )
    stack.env.update(
        TRAINYARD_HEARTBEAT_SECONDS="1",
        TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS="5",
        TRAINYARD_RECONCILE_SECONDS="1",
        TRAINYARD_UNREACHABLE_GRACE_SECONDS="20",
        # The runner retires soon after its job, so each test can check that
        # nothing of its runner is left running.
        TRAINYARD_LOCAL_RUNNER_IDLE_SECONDS="5",
    )
    reported("outage_stack", stack)
    try:
        stack.start_all()
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope="module")
def alice(outage_stack: Stack) -> User:
    return User("alice", outage_stack.issue_token("alice"), outage_stack)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = make_repo(tmp_path / "tiny-train")
    (path / ".trainyard" / "workflows.yaml").write_text(TICKER)
    return path


def test_the_web_process_frozen_for_60s(alice: User, repo: Path) -> None:
    name = _ticker_running(alice, repo)

    alice.stack.pause("web")
    try:
        time.sleep(60)
    finally:
        alice.stack.resume("web")

    _assert_rode_it_out(alice, name)


def test_valkey_killed_and_started_again_after_30s(alice: User, repo: Path, servers: Servers) -> None:
    """A follower connected throughout gets the lines printed after Redis is
    back live (within 5 s of their reading), not only at its next re-check
    from storage, 30 s later. The runner's own socket may have closed in the
    outage: lines count from when its next try is due (its backoff's cap, with
    jitter) and 5 s more to connect. (This Valkey keeps its data across the
    restart: the relay's joining again at once, for a Redis that comes back
    empty, is not what this tells apart.)"""
    name = _ticker_running(alice, repo)
    follower = _Follower(alice, name)

    servers.valkey_kill()
    try:
        time.sleep(30)
    finally:
        servers.valkey.start()
    back_at = time.time()

    _assert_rode_it_out(alice, name)
    follower.stop()
    assert follower.error is None, follower.error
    reconnected_by = back_at + BACKOFF_MAX * 1.2 + 5
    later = [(arrived - ts) for arrived, ts in follower.lines if ts > reconnected_by]
    assert later, "the follower got no line printed after Redis was back"
    assert max(later) < 5, sorted(later)[-5:]


def test_postgres_restarted(alice: User, repo: Path, servers: Servers) -> None:
    name = _ticker_running(alice, repo)

    servers.postgres.stop()
    try:
        time.sleep(20)  # a failover's worth of downtime, not a blip
    finally:
        servers.postgres.start()

    _assert_rode_it_out(alice, name)


class _Follower:
    """A websocket following ``run`` in a thread: (arrival, line's ts) of every line received."""

    def __init__(self, alice: User, run: str) -> None:
        self.lines: list[tuple[float, float]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        url = f"{alice.stack.ws_url}/ws/v1/workspaces/{alice.workspace}/runs/{run}/"
        self._ws = connect(url, additional_headers={"Authorization": f"Bearer {alice.token}"}, legacy=True)
        # Subscribed once the run's snapshot came: only then is it "connected throughout".
        while json.loads(self._ws.recv(timeout=10))["type"] != "run":
            pass
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    frame = json.loads(self._ws.recv(timeout=0.5))
                except TimeoutError:
                    continue
                if frame["type"] == "logs":
                    arrived = time.time()
                    self.lines += [(arrived, ts) for _, ts, _, _ in frame_lines(frame)]
        except BaseException as e:  # reported by the test
            if not self._stop.is_set():
                self.error = e

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._ws.close()


def _ticker_running(alice: User, repo: Path) -> str:
    name = run_name_of(alice.cli(repo, "run", "ticker", "-d"))
    alice.wait(name, lambda r: r["status"] == "running" and r["jobs"][0]["last_seq"] >= STORED_BEFORE_OUTAGE)
    return name


def _assert_rode_it_out(alice: User, name: str) -> None:
    run = alice.wait(name, lambda r: r["status"] in FINISHED, timeout=120)
    job = run["jobs"][0]

    assert run["status"] == "succeeded", run
    assert [(a["number"], a["reason"]) for a in job["attempts"]] == [(1, "done")], job["attempts"]
    assert _stored(alice, job["id"]) == [(i, f"line {i}") for i in range(1, LINES + 1)]
    _assert_no_runner_left(alice.stack)


def _stored(alice: User, job: str) -> list[tuple[int, str]]:
    path = f"/api/v1/workspaces/{alice.workspace}/jobs/{job}/logs/"
    page = alice.api("GET", path, params={"after_seq": 0, "limit": 10000}).json()
    assert not page["has_more"]
    return [(line["seq"], line["text"]) for line in page["lines"]]


def _assert_no_runner_left(stack: Stack) -> None:
    """The idle runner retires (TRAINYARD_LOCAL_RUNNER_IDLE_SECONDS) and nothing of it stays."""
    deadline = time.monotonic() + RUNNERS_GONE_TIMEOUT
    while stack.runner_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stack.runner_processes() == []


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

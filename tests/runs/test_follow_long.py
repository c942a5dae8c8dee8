"""Followers that stay long, over the real ASGI server (uvicorn) and real
websockets: past the channel layer's group expiry, past a lost final status
event (the CLI), and one that stops reading for 30 s while a runner streams."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from trainyard.api import Client
from trainyard.follow import Follower
from trainyard.output import LogWriter
from trainyard_runner import protocol
from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.http11 import Response
from websockets.sync.client import ClientConnection, connect
from websockets.uri import parse_uri

from backend.accounts.models import Workspace
from backend.accounts.services import hash_token
from backend.clouds.models import Instance, InstanceStatus
from backend.runs.api.serializers import run_to_dict
from backend.runs.events import publish, run_group
from backend.runs.models import Job, Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.logs import logs_store
from tests.support.attempts import accept, current_attempt
from tests.support.fixtures import Person
from tests.support.frames import frame_lines, logs_frame
from tests.support.web import WebServer, WebServers

pytestmark = pytest.mark.django_db(transaction=True)


def follow(server: WebServer, run: Run, token: str) -> ClientConnection:
    url = f"{server.ws_url}/ws/v1/workspaces/acme/runs/{run.name}/"
    return connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10, max_size=None)


def test_a_follower_stays_subscribed_past_the_group_expiry(web_server: WebServers, run: Run, member: Person) -> None:
    server = web_server.start(TRAINYARD_CHANNEL_GROUP_EXPIRY_SECONDS="2")
    with follow(server, run, member.token) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "run"
        time.sleep(5)  # more than twice the group expiry
        # Only through the group: the database still says pending, so no catch-up sends this.
        publish(run_group(run.pk), {"type": "run.status", "run": {**run_to_dict(run), "status": "running"}})

        update = json.loads(ws.recv(timeout=10))

    assert update["type"] == "run" and update["run"]["status"] == "running"


def test_the_cli_ends_when_the_runs_final_status_event_is_lost(
    web_server: WebServers, run: Run, member: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = web_server.start(TRAINYARD_WS_RECHECK_SECONDS="600")  # no server-side catch-up meanwhile
    monkeypatch.setattr("trainyard.follow.STATUS_CHECK_SECONDS", 2.0, raising=False)
    statuses: list[str] = []
    client = Client(server.url, member.token, "acme")
    follower = Follower(
        client, run.name, writer=LogWriter(io.StringIO(), io.StringIO()), on_run=lambda r: statuses.append(r["status"])
    )

    result: list[dict[str, Any]] = []
    following = threading.Thread(target=lambda: result.append(follower.follow()), daemon=True)
    following.start()
    _wait_for(lambda: statuses == ["pending"])
    # The run finishes and its event is lost: nothing is published.
    Job.objects.filter(run=run).update(status="succeeded")
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    following.join(timeout=20)

    client.close()
    assert result, "the follower still waits for the run to finish"
    assert result[0]["status"] == "succeeded"
    assert statuses == ["pending", "succeeded"]


# --- a slow follower ---------------------------------------------------------------

BATCHES = 1400  # 40 a second for 35 s
BATCHES_PER_SECOND = 40
LINES_PER_BATCH = 50
TOTAL = BATCHES * LINES_PER_BATCH
SLOW_PAUSE_SECONDS = 30.0


def _text(seq: int) -> str:
    return f"line {seq:07d} " + "x" * 180


@dataclass
class Received:
    """Lines a follower received: seqs in order of arrival, and when each batch's last line came."""

    seqs: list[int] = field(default_factory=list)
    texts_ok: bool = True
    at: dict[int, float] = field(default_factory=dict)

    def add(self, frame: dict[str, Any]) -> None:
        if frame.get("type") != "logs":
            return
        now = time.monotonic()
        for seq, _, _, text in frame_lines(frame):
            self.seqs.append(seq)
            self.texts_ok = self.texts_ok and text == _text(seq)
            self.at[seq] = now


@pytest.mark.slow
def test_a_follower_that_stops_reading_slows_neither_the_runner_nor_other_followers(
    web_server: WebServers, team: Workspace, run: Run, member: Person
) -> None:
    server = web_server.start()
    # The slow follower alone in another web process, as behind a load balancer: nothing
    # else there reads from the channel layer while its socket is stalled.
    other = web_server.start()
    job = _running_job(team, run)
    fast = Received()
    with follow(server, run, member.token) as fast_ws, _SlowFollower(other, run, member.token) as slow:
        reading = threading.Thread(target=_read_until, args=(fast_ws, fast, TOTAL), daemon=True)
        reading.start()
        started = time.monotonic()
        sent_at, ack_seconds = _stream(server, job)
        streamed_for = time.monotonic() - started
        reading.join(timeout=30)
        paused_for = slow.resume_after(SLOW_PAUSE_SECONDS - (time.monotonic() - slow.connected_at))
        slow_lines = slow.read_until(TOTAL, timeout=60)

    # The runner's ingest kept its pace, and every batch was acknowledged promptly.
    assert streamed_for < BATCHES / BATCHES_PER_SECOND * 1.5, streamed_for
    assert max(ack_seconds) < 2.0, sorted(ack_seconds)[-10:]
    # The other follower got every line once, in order, and soon after it was sent.
    assert fast.seqs == list(range(1, TOTAL + 1)) and fast.texts_ok
    latencies = [fast.at[last] - sent for last, sent in sent_at.items()]
    assert max(latencies) < 3.0, sorted(latencies)[-10:]
    # The slow one read nothing for 30 s while all of it was sent, then caught up: every line, in order, once.
    assert paused_for >= SLOW_PAUSE_SECONDS and streamed_for < SLOW_PAUSE_SECONDS + 10
    assert slow_lines.seqs == list(range(1, TOTAL + 1)) and slow_lines.texts_ok


def _running_job(team: Workspace, run: Run) -> Job:
    Instance.objects.create(
        workspace=team,
        backend="local",
        name="local-slow",
        token_hash=hash_token("runner-secret"),
        status=InstanceStatus.IDLE,
        channel_name="x",
    )
    jobs_schedule()
    job = run.jobs.get()
    accept(job, Instance.objects.get(name="local-slow").pk)
    return job


def _stream(server: WebServer, job: Job) -> tuple[dict[int, float], list[float]]:
    """A runner sends BATCHES batches at BATCHES_PER_SECOND, each after the
    previous one's ack; returns (last seq of each batch → when it was sent,
    seconds from each send to its ack)."""
    held = protocol.HeldJob(job=str(job.pk), attempt=1, lease=current_attempt(job).lease, confirmed=True)
    hello = protocol.Hello(
        version="test",
        hostname="box",
        resources=protocol.Resources(cpus=2, memory_bytes=2**31, disk_bytes=2**33),
        running_jobs=[held],
    )
    sent_at: dict[int, float] = {}
    ack_seconds: list[float] = []
    headers = {"Authorization": "Bearer runner-secret"}
    with connect(f"{server.ws_url}/ws/runner/", additional_headers=headers, open_timeout=10) as runner:
        runner.send(hello.model_dump_json())
        assert json.loads(runner.recv(timeout=10))["type"] == "welcome"
        start = time.monotonic()
        for batch in range(BATCHES):
            time.sleep(max(0.0, start + batch / BATCHES_PER_SECOND - time.monotonic()))
            first = batch * LINES_PER_BATCH + 1
            lines = [(time.time(), "o", _text(seq)) for seq in range(first, first + LINES_PER_BATCH)]
            sent = time.monotonic()
            runner.send(protocol.Logs.of(job=str(job.pk), attempt=1, first_seq=first, lines=lines).model_dump_json())
            sent_at[first + LINES_PER_BATCH - 1] = sent
            while json.loads(runner.recv(timeout=30)) != {
                "type": "log_ack",
                "job": str(job.pk),
                "seq": first + LINES_PER_BATCH - 1,
            }:
                pass
            ack_seconds.append(time.monotonic() - sent)
    return sent_at, ack_seconds


def _read_until(ws: ClientConnection, into: Received, last_seq: int) -> None:
    while not into.seqs or into.seqs[-1] < last_seq:
        into.add(json.loads(ws.recv(timeout=60)))


class _SlowFollower:
    """A real websocket client on a raw socket that, after the handshake,
    does not read at all (a small receive buffer, so the server feels it at
    once) until ``resume_after``; then it reads, answering pings."""

    def __init__(self, server: WebServer, run: Run, token: str) -> None:
        self.protocol = ClientProtocol(
            parse_uri(f"{server.ws_url}/ws/v1/workspaces/acme/runs/{run.name}/"), max_size=None
        )
        request = self.protocol.connect()
        request.headers["Authorization"] = f"Bearer {token}"
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        self.sock.connect(("127.0.0.1", server.port))
        self.protocol.send_request(request)
        self._flush()
        self.received = Received()
        self._handshake()
        self.connected_at = time.monotonic()

    def __enter__(self) -> _SlowFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def resume_after(self, seconds: float) -> float:
        time.sleep(max(0.0, seconds))
        return time.monotonic() - self.connected_at

    def read_until(self, last_seq: int, *, timeout: float) -> Received:
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while not self.received.seqs or self.received.seqs[-1] < last_seq:
            assert time.monotonic() < deadline, f"the slow follower got {len(self.received.seqs)} of {last_seq} lines"
            data = self.sock.recv(1 << 20)
            assert data, "the server closed the slow follower's connection"
            self.protocol.receive_data(data)
            self._flush()  # pongs
            for event in self.protocol.events_received():
                if getattr(event, "opcode", None) is Opcode.TEXT:
                    self.received.add(json.loads(event.data))
        return self.received

    def _handshake(self) -> None:
        upgraded = False
        while not upgraded:
            self.protocol.receive_data(self.sock.recv(4096))
            for event in self.protocol.events_received():
                if isinstance(event, Response):
                    assert event.status_code == 101, event.status_code
                    upgraded = True
                elif getattr(event, "opcode", None) is Opcode.TEXT:
                    self.received.add(json.loads(event.data))

    def _flush(self) -> None:
        for chunk in self.protocol.data_to_send():
            self.sock.sendall(chunk)


def _wait_for(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_follower_gets_the_final_status_and_lines_whose_events_were_lost(
    web_server: WebServers, team: Workspace, run: Run, member: Person
) -> None:
    """The dashboard has no REST fallback: the server's re-check catches it up."""
    server = web_server.start(TRAINYARD_WS_RECHECK_SECONDS="1")
    job = _running_job(team, run)
    with follow(server, run, member.token) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "run"
        # Stored and finished, and nothing published (as when the channel layer drops it all).
        instance = Instance.objects.get(name="local-slow")
        logs_store(job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=1,
                   lines=[(1.0, "o", "one"), (2.0, "o", "two")])  # fmt: skip
        Job.objects.filter(pk=job.pk).update(status="succeeded")
        Run.objects.filter(pk=run.pk).update(status="succeeded")

        frames = [json.loads(ws.recv(timeout=10)) for _ in range(2)]

    assert frames[0]["type"] == "run" and frames[0]["run"]["status"] == "succeeded"
    assert frames[1] == logs_frame(str(job.pk), [[1, 1.0, "o", "one"], [2, 2.0, "o", "two"]])

"""A spot interruption notice on the runner (``--cloud aws``): real runner
processes against the fake server, each with its own IMDSv2 endpoint that
the test controls (tests/support/imds.py).

The notice is reported ``interrupted`` within seconds; the job gets SIGTERM
first, reads the deadline from ``TRAINYARD_INTERRUPT_FILE`` and is SIGKILLed
no earlier (and not much later) than T-10 s; a rebalance recommendation only
syncs the checkpoint; a notice during the setup is an interruption, not a
failure; metadata is read with IMDSv2 only, a refused session token is
replaced."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from trainyard_runner import machine
from trainyard_runner.spot import parse_notice
from websockets.asyncio.server import serve

from tests.runner.test_agent import TOKEN, FakeServer, assign, stop
from tests.support.imds import NOTICE, REBALANCE, ImdsServer, iso

TRAPPING_JOB = [
    # SIGTERM: note when, keep the deadline the runner wrote, and go on (so only SIGKILL ends it).
    # The whole group gets the SIGTERM: whichever child it lands on (date or sleep) is allowed
    # to die without ``set -e`` ending the script.
    'trap \'date +%s.%N > "$MARK/term"; cp "$TRAINYARD_INTERRUPT_FILE" "$MARK/interrupt"\' TERM',
    'echo "interrupt file: $TRAINYARD_INTERRUPT_FILE"',
    # Written aside and renamed: the SIGKILL may land between the truncation and the write.
    'while true; do date +%s.%N > "$MARK/alive.new" && mv "$MARK/alive.new" "$MARK/alive" || true; sleep 0.1 || true; done',
]


@pytest.fixture
def imds() -> Any:
    with ImdsServer(instance_id="i-0spot") as server:
        yield server


async def _runner(port: int, work: Path, imds: ImdsServer, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "trainyard_runner",
        "--server",
        f"ws://127.0.0.1:{port}",
        "--work-dir",
        str(work),
        "--no-jobs-outlive-runner",
        "--cloud",
        "aws",
        *extra,
        env={**os.environ, "TRAINYARD_RUNNER_TOKEN": TOKEN, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url},
        stderr=asyncio.subprocess.PIPE,
    )


class StderrTail:
    """Collects a runner's stderr while it runs."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.lines: list[str] = []
        self._task = asyncio.create_task(self._read(proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)

    async def close(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self._task, 5)


def _states(server: FakeServer, job: str) -> list[dict[str, Any]]:
    return [m for m in server.received if m["type"] == "job_state" and m["job"] == job]


def _at(server: FakeServer, job: str, state: str, *, final: bool) -> float | None:
    """When the fake server received ``state`` (the first one; final: with an exit code or the last)."""
    for m in _states(server, job):
        if m["state"] == state and (m.get("exit_code") is not None) == final:
            return float(m.setdefault("_received_at", time.time()))
    return None


async def _wait(server: FakeServer, predicate: Any, timeout: float) -> None:
    """Poll ``predicate``, noting when each frame arrived (within 50 ms) as ``_received_at``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out; received {server.received[-5:]}"
        for m in server.received:
            m.setdefault("_received_at", time.time())
        await asyncio.sleep(0.05)
    for m in server.received:
        m.setdefault("_received_at", time.time())


def test_a_notice_reports_interrupted_at_once_sigterms_the_job_and_kills_it_at_t_minus_10(
    tmp_path: Path, repo: tuple[Path, str], imds: ImdsServer, drop: Path
) -> None:
    mark = drop / "mark"
    mark.mkdir()
    mark.chmod(0o777)
    job = assign("j", TRAPPING_JOB, repo)
    job["env"] = {"MARK": str(mark)}

    async def go() -> tuple[FakeServer, float, float, StderrTail]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            runner = await _runner(port, tmp_path / "rd", imds, "--spot-poll-seconds", "1")
            tail = StderrTail(runner)
            try:
                await server.to_send.put(job)
                await _wait(server, lambda: (mark / "alive").exists(), 20)
                deadline = round(time.time()) + 25.0
                imds.notice("terminate", deadline)
                noticed = time.time()
                await _wait(server, lambda: _at(server, "j", "interrupted", final=True) is not None, 40)
                # The runner takes no new job on a machine being reclaimed.
                await server.to_send.put({**assign("k", ["true"], repo), "lease": "lease-k"})
                await _wait(server, lambda: any(m["type"] == "job_rejected" for m in server.received), 5)
            finally:
                await stop(runner)
                await tail.close()
        return server, noticed, deadline, tail

    server, noticed, deadline, tail = asyncio.run(go())
    reported = _at(server, "j", "interrupted", final=False)
    assert reported is not None, _states(server, "j")
    assert reported - noticed < 5.0, "the interruption is reported within seconds of the notice"
    first = next(m for m in _states(server, "j") if m["state"] == "interrupted")
    assert first["interrupt_at"] == deadline
    assert iso(deadline) in first["reason"]
    # SIGTERM first (right after the notice), then SIGKILL no earlier than T-10 s.
    term = float((mark / "term").read_text())
    assert noticed < term < noticed + 5.0
    ended = _at(server, "j", "interrupted", final=True)  # sent after the kill
    assert ended is not None
    assert ended >= deadline - 10, f"killed {deadline - ended:.1f}s before T"
    assert ended <= deadline - 10 + 4.0, "killed no later than about T-10 s"
    last_alive = float((mark / "alive").read_text())
    assert last_alive >= deadline - 12, "the job ran on after its SIGTERM until it was killed"
    final = [m for m in _states(server, "j") if m.get("exit_code") is not None]
    assert [(m["state"], m["exit_code"]) for m in final] == [("interrupted", 137)]
    assert not any(m["state"] in ("failed", "stopped") for m in _states(server, "j"))
    # The job learned T from the interrupt file.
    values = dict(line.split("=", 1) for line in (mark / "interrupt").read_text().splitlines())
    assert values["TRAINYARD_INTERRUPT_AT"] == iso(deadline)
    assert float(values["TRAINYARD_INTERRUPT_AT_UNIX"]) == deadline
    assert values["TRAINYARD_INTERRUPT_ACTION"] == "terminate"
    # Less than 45 s left: synced at once; not again after the kill.
    assert tail.count("syncing the checkpoint (interruption)") == 1, tail.lines
    rejected = next(m for m in server.received if m["type"] == "job_rejected")
    assert "reclaimed" in rejected["reason"]
    assert not imds.without_token()


def test_a_job_that_exits_on_sigterm_is_synced_and_reported_with_its_exit_code(
    tmp_path: Path, repo: tuple[Path, str], imds: ImdsServer, drop: Path
) -> None:
    mark = drop / "mark"
    mark.mkdir()
    mark.chmod(0o777)
    script = [
        "trap 'echo saved > \"$MARK/checkpoint\"; exit 0' TERM",
        'while true; do date +%s.%N > "$MARK/alive" || true; sleep 0.1 || true; done',
    ]
    job = assign("j", script, repo)
    job["env"] = {"MARK": str(mark)}

    async def go() -> tuple[FakeServer, float, StderrTail]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            runner = await _runner(port, tmp_path / "rd", imds, "--spot-poll-seconds", "1")
            tail = StderrTail(runner)
            try:
                await server.to_send.put(job)
                await _wait(server, lambda: (mark / "alive").exists(), 20)
                imds.notice("terminate", time.time() + 120)
                noticed = time.time()
                await _wait(server, lambda: _at(server, "j", "interrupted", final=True) is not None, 20)
            finally:
                await stop(runner)
                await tail.close()
        return server, noticed, tail

    server, noticed, tail = asyncio.run(go())
    ended = _at(server, "j", "interrupted", final=True)
    assert ended is not None and ended - noticed < 8.0, "a job that exits on SIGTERM is not held until T-45 s"
    assert (mark / "checkpoint").read_text() == "saved\n"
    final = [m for m in _states(server, "j") if m.get("exit_code") is not None]
    assert [(m["state"], m["exit_code"]) for m in final] == [("interrupted", 0)]
    assert tail.count("syncing the checkpoint (interruption)") == 1, tail.lines


def test_a_rebalance_recommendation_only_syncs_and_the_job_goes_on_with_imdsv2_only(
    tmp_path: Path, repo: tuple[Path, str], imds: ImdsServer, drop: Path
) -> None:
    mark = drop / "mark"
    mark.mkdir()
    mark.chmod(0o777)
    job = assign("j", ['for i in $(seq 60); do date +%s.%N > "$MARK/alive"; sleep 0.1 || true; done'], repo)
    job["env"] = {"MARK": str(mark)}

    async def go() -> tuple[FakeServer, StderrTail, float]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            extra = ("--spot-poll-seconds", "0.3", "--rebalance-poll-seconds", "0.5")
            runner = await _runner(port, tmp_path / "rd", imds, *extra)
            tail = StderrTail(runner)
            try:
                await server.to_send.put(job)
                await _wait(server, lambda: (mark / "alive").exists(), 20)
                imds.expire_tokens()  # the session token is refused from now on: the runner asks for a new one
                imds.rebalance()
                recommended = time.time()
                await _wait(server, lambda: tail.count("syncing the checkpoint (rebalance)") >= 1, 10)
                await _wait(server, lambda: any(m.get("exit_code") is not None for m in _states(server, "j")), 20)
            finally:
                await stop(runner)
                await tail.close()
        return server, tail, recommended

    server, tail, recommended = asyncio.run(go())
    assert [(m["state"], m["exit_code"]) for m in _states(server, "j")][-1] == ("succeeded", 0)
    assert not any(m["state"] == "interrupted" for m in _states(server, "j"))
    assert float((mark / "alive").read_text()) > recommended + 1.0, "the job went on after the recommendation"
    # One recommendation, one sync, although it was read again and again.
    assert tail.count("syncing the checkpoint (rebalance)") == 1, tail.lines
    assert len(imds.reads(REBALANCE)) >= 3
    assert len(imds.reads(NOTICE)) >= 3
    # IMDSv2 only: never a read without a token; a 401 is followed by a new PUT and a good read.
    assert not imds.without_token()
    refused = [i for i, r in enumerate(imds.requests) if r.status == 401]
    assert refused, "expire_tokens made a read fail"
    after = imds.requests[refused[0] + 1 :]
    assert after[0].method == "PUT" and after[0].status == 200
    assert any(r.method == "GET" and r.status in (200, 404) for r in after[1:])
    assert all(r.status == 200 for r in imds.puts()), "every token PUT asks for a TTL within 1..21600"


def test_a_notice_during_the_setup_is_an_interruption_not_a_failure(
    tmp_path: Path, repo: tuple[Path, str], imds: ImdsServer, file_server: Any, drop: Path
) -> None:
    url, size, sha = file_server.add("/big", b"x" * 200_000)  # 10 s at the "slow" rate
    file_server.faults["/big"] = ["slow"]
    mark = drop / "mark"
    mark.mkdir()
    mark.chmod(0o777)
    job = assign("j", ['touch "$MARK/ran"'], repo)
    job["env"] = {"MARK": str(mark)}
    file_server.serve_input(job, "in", [{"path": "big", "size": size, "sha256": sha, "url": url}])

    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            runner = await _runner(
                port, tmp_path / "rd", imds, "--spot-poll-seconds", "0.5", "--api-origin", job["api_url"]
            )
            try:
                await server.to_send.put(job)
                await _wait(server, lambda: len(_states(server, "j")) == 2, 20)  # fetching inputs
                imds.notice("stop", time.time() + 60)
                await _wait(
                    server,
                    lambda: any(
                        m.get("exit_code") is None and m["state"] == "interrupted" for m in _states(server, "j")[2:]
                    ),
                    10,
                )
                await asyncio.sleep(1.0)
            finally:
                await stop(runner)
        return server

    server = asyncio.run(go())
    states = [m["state"] for m in _states(server, "j")]
    assert states[:2] == ["preparing", "preparing"]
    assert set(states[2:]) == {"interrupted"}, states
    assert "will stop this machine" in _states(server, "j")[2]["reason"]
    assert not (mark / "ran").exists(), "the commands never started"


def test_the_imds_client_refreshes_its_token_before_the_ttl_and_caps_the_ttl(imds: ImdsServer) -> None:
    client = machine.Imds(imds.url, ttl=2)
    assert client.get("instance-id") == "i-0spot"
    assert client.get("instance-id") == "i-0spot"
    assert len(imds.puts()) == 1, "the token is reused while it is fresh"
    time.sleep(1.2)  # past half of a 2 s TTL
    assert client.get(NOTICE) is None  # 404: no notice
    assert len(imds.puts()) == 2, "asked for again before it expires"
    assert machine.Imds(imds.url, ttl=10**6).get("placement/region") == "us-east-1"  # capped at 21600, accepted
    assert not imds.without_token()


def test_a_notice_is_parsed_and_nonsense_is_not_one() -> None:
    notice = parse_notice('{"action": "terminate", "time": "2026-12-01T12:00:00Z"}')
    assert notice is not None
    assert (notice.action, notice.when) == ("terminate", "2026-12-01T12:00:00Z")
    assert notice.at == datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()
    for body in ("", "{}", "[]", '{"action": "stop"}', '{"time": "soon"}', "<html>"):
        assert parse_notice(body) is None, body

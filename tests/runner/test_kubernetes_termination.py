"""``--cloud kubernetes``: the pod's SIGTERM is the interruption notice.
Real runner processes against the fake server; the runner gets SIGTERM as a
pod's main process passes it on. The job gets SIGTERM, writes its
checkpoint, the checkpoint is synced (to a stand-in of the checkpoint
endpoints) within the pod's grace period, the job is reported
``interrupted``, and the runner exits 0 before the grace is over."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from trainyard_runner.spot import TERMINATION_MARGIN, pod_termination_notice
from websockets.asyncio.server import serve

from tests.runner.test_agent import FakeServer, assign, start_runner, stop
from tests.runner.test_spot_notice import StderrTail, _at, _states, _wait


class Checkpoints:
    """The checkpoint endpoints as the server answers them: a sync begins a
    version listing its files, asks for the ones that differ from the latest,
    and completes; ``done`` says the attempt makes no more syncs."""

    def __init__(self) -> None:
        self.latest: dict[str, str] = {}
        self.pending: dict[str, dict[str, str]] = {}
        self.puts: list[tuple[str, bytes]] = []  # (file path, content), in order
        self.completed = 0
        self.done: list[str] = []
        self.url = ""


@pytest.fixture
def checkpoints() -> Iterator[Checkpoints]:
    state = Checkpoints()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if "/checkpoints/done/" in self.path:
                state.done.append(self.path)
                return self._json(200, {})
            if "/complete/" in self.path:
                vid = self.path.split("/artifacts/")[1].split("/")[0]
                state.latest = state.pending.pop(vid)
                state.completed += 1
                return self._json(200, {"number": state.completed, "latest": True})
            vid = f"v{len(state.pending) + state.completed + 1}"
            files = {f["path"]: f["sha256"] for f in body["files"]}
            state.pending[vid] = files
            changed = [p for p, sha in files.items() if state.latest.get(p) != sha]
            uploads = [{"path": p, "url": f"/put/{vid}/{p}"} for p in changed]
            self._json(201, {"id": vid, "number": 1, "carried": len(files) - len(changed), "uploads": uploads})

        def do_PUT(self) -> None:
            data = self.rfile.read(int(self.headers["Content-Length"]))
            state.puts.append((self.path.split("/", 3)[3], data))
            self._json(200, {})

        def _json(self, status: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/api/v1"
    yield state
    server.shutdown()


# Writes its checkpoint every 0.1 s; on SIGTERM notes the deadline the
# runner gave it, writes the final one (taking a second), and exits 0.
CHECKPOINTING_JOB = [
    'mkdir -p ckpt; trap \'echo final > ckpt/state; cp "$TRAINYARD_INTERRUPT_FILE" "$MARK/interrupt";'
    ' date +%s.%N > "$MARK/term"; sleep 1; exit 0\' TERM',
    'i=0; while true; do i=$((i+1)); echo "step $i" > ckpt/state; touch "$MARK/alive"; sleep 0.1 || true; done',
]


def test_a_pods_sigterm_winds_the_job_down_syncs_its_checkpoint_reports_it_interrupted_and_the_runner_exits_0(
    tmp_path: Path, repo: tuple[Path, str], drop: Path, checkpoints: Checkpoints
) -> None:
    mark = drop / "mark"
    mark.mkdir()
    mark.chmod(0o777)
    job = assign("j", CHECKPOINTING_JOB, repo)
    job["env"] = {"MARK": str(mark)}
    job["api_url"] = checkpoints.url
    job["checkpoint"] = {"path": "./ckpt"}
    grace = 40.0

    async def go() -> tuple[FakeServer, float, float, int, StderrTail]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            # As in a pod: the jobs would outlive a runner that merely stops.
            runner = await start_runner(
                port,
                tmp_path / "rd",
                "--cloud",
                "kubernetes",
                outlive=True,
                api_url=checkpoints.url,
                env={"TRAINYARD_RUNNER_TERMINATION_GRACE": str(grace)},
            )
            tail = StderrTail(runner)
            try:
                await server.to_send.put(job)
                await _wait(server, lambda: (mark / "alive").exists(), 20)
                runner.send_signal(signal.SIGTERM)
                signalled = time.time()
                await asyncio.sleep(0.3)
                runner.send_signal(signal.SIGTERM)  # a second one (the pod's wrapper, a retry) changes nothing
                code = await asyncio.wait_for(runner.wait(), grace)
                exited = time.time()
            finally:
                await stop(runner)
                await tail.close()
        return server, signalled, exited, code, tail

    server, signalled, exited, code, tail = asyncio.run(go())
    assert code == 0, tail.lines[-20:]
    assert exited - signalled < 10.0, "a job that exits on SIGTERM does not hold the runner until the deadline"
    # The job got SIGTERM at once and learned the deadline: the pod's grace less the margin.
    assert float((mark / "term").read_text()) - signalled < 5.0
    values = dict(line.split("=", 1) for line in (mark / "interrupt").read_text().splitlines())
    deadline = float(values["TRAINYARD_INTERRUPT_AT_UNIX"])
    assert abs(deadline - (signalled + grace - TERMINATION_MARGIN)) < 2.0
    assert values["TRAINYARD_INTERRUPT_ACTION"] == "terminate"
    # Reported interrupted at once (the server moves the job now), then its final state.
    reported = _at(server, "j", "interrupted", final=False)
    assert reported is not None and reported - signalled < 5.0, _states(server, "j")
    first = next(m for m in _states(server, "j") if m["state"] == "interrupted")
    assert "the pod got SIGTERM" in first["reason"]
    assert first["interrupt_at"] == pytest.approx(deadline, abs=1.0)
    final = [(m["state"], m["exit_code"]) for m in _states(server, "j") if m.get("exit_code") is not None]
    assert final == [("interrupted", 0)]
    # The checkpoint the job wrote on SIGTERM is the one synced last; the next attempt need not wait.
    assert checkpoints.puts, "the checkpoint was synced"
    assert checkpoints.puts[-1] == ("state", b"final\n")
    assert len(checkpoints.done) == 1
    assert tail.count("another SIGTERM") == 1, tail.lines
    assert not any(m["type"] == "job_state" and m["state"] in ("failed", "stopped") for m in server.received)


def test_a_job_that_ignores_the_sigterm_is_killed_before_the_grace_ends_and_an_idle_runner_exits_at_once(
    tmp_path: Path, repo: tuple[Path, str], drop: Path
) -> None:
    mark = drop / "mark"
    mark.mkdir()
    mark.chmod(0o777)
    job = assign("j", ["trap 'touch \"$MARK/term\"' TERM", 'while true; do touch "$MARK/alive"; sleep 0.1 || true; done'],
                 repo)  # fmt: skip
    job["env"] = {"MARK": str(mark)}
    grace = 20.0  # the deadline is 15 s away: the job is killed 10 s before it

    async def go() -> tuple[FakeServer, float, float, int, float, int]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            extra = ("--cloud", "kubernetes", "--termination-grace", str(grace))
            runner = await start_runner(port, tmp_path / "rd", *extra, outlive=True)
            idle = await start_runner(port, tmp_path / "idle", *extra, outlive=True)
            try:
                await server.wait_for(lambda: len(server.hellos) == 2, 20)
                idle.send_signal(signal.SIGTERM)
                idle_signalled = time.time()
                idle_code = await asyncio.wait_for(idle.wait(), 10)
                idle_took = time.time() - idle_signalled
                await server.to_send.put(job)
                await _wait(server, lambda: (mark / "alive").exists(), 20)
                runner.send_signal(signal.SIGTERM)
                signalled = time.time()
                code = await asyncio.wait_for(runner.wait(), grace)
                exited = time.time()
            finally:
                await stop(runner)
                await stop(idle)
        return server, signalled, exited, code, idle_took, idle_code

    server, signalled, exited, code, idle_took, idle_code = asyncio.run(go())
    assert (idle_code, idle_took < 3.0) == (0, True), "an idle runner has nothing to wind down"
    assert code == 0
    assert (mark / "term").exists()
    killed_by = signalled + grace - TERMINATION_MARGIN - 10.0
    assert killed_by - 1.0 <= exited <= killed_by + 4.0, f"exited {exited - signalled:.1f}s after the SIGTERM"
    final = [(m["state"], m["exit_code"]) for m in _states(server, "j") if m.get("exit_code") is not None]
    assert final == [("interrupted", 137)]
    time.sleep(0.3)
    alive = (mark / "alive").stat().st_mtime
    time.sleep(0.5)
    assert (mark / "alive").stat().st_mtime == alive, "nothing of the job runs on"


def test_the_notice_is_due_the_margin_before_the_pods_sigkill_and_never_in_the_past() -> None:
    notice = pod_termination_notice(120, now=1_796_126_400.0)
    assert (notice.action, notice.at, notice.when) == ("terminate", 1_796_126_515.0, "2026-12-01T12:01:55Z")
    assert "the pod got SIGTERM" in notice.reason and "120s" in notice.reason
    assert pod_termination_notice(3, now=1_796_126_400.0).at == 1_796_126_400.0, "a grace shorter than the margin"

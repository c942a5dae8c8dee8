"""End to end: a real ``trainyard-runner`` process against a small fake
server (websockets' asyncio ``serve`` on 127.0.0.1) that stores log lines the
way the real server does: only the next seq, acknowledging the highest stored."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from trainyard_runner.protocol import CLOSE_IN_USE, PROTOCOL_VERSION, chunk_lines
from websockets.asyncio.server import ServerConnection, serve

TOKEN = "runner-token"


class FakeServer:
    def __init__(self, *, cut_after_frames: list[int] | None = None) -> None:
        self.stored: dict[str, list[list[Any]]] = {}
        self.received: list[dict[str, Any]] = []  # every frame except logs
        self.hellos: list[dict[str, Any]] = []
        self.connections = 0
        self.cuts = list(cut_after_frames or [])  # cut the n-th logs frame of a connection
        self.to_send: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.first_log_at: dict[str, float] = {}
        self.changed = asyncio.Event()
        self.confirm = True  # answer every acceptance with job_confirmed, as the server does
        self.current: ServerConnection | None = None
        self.welcome_extra: dict[str, Any] = {}
        self.refuse_hellos: list[tuple[int, str]] = []  # close the next hellos with these (code, reason)

    async def handler(self, ws: ServerConnection) -> None:
        if ws.request.headers.get("Authorization") != f"Bearer {TOKEN}":  # type: ignore[union-attr]
            await ws.close(4401, "bad token")
            return
        self.connections += 1
        self.current = ws
        self.hellos.append(json.loads(await ws.recv()))
        if self.refuse_hellos:
            await ws.close(*self.refuse_hellos.pop(0))
            return
        acked = {job: len(lines) for job, lines in self.stored.items()}
        held = [h["job"] for h in self.hellos[-1]["running_jobs"]]
        welcome = {"type": "welcome", "instance": "i-1", "heartbeat_seconds": 0.5, "acked": acked, "confirmed": held}
        welcome.update(self.welcome_extra)
        await ws.send(json.dumps(welcome))
        sender = asyncio.create_task(self._send_queued(ws))
        try:
            await self._receive(ws)
        finally:
            sender.cancel()

    async def _send_queued(self, ws: ServerConnection) -> None:
        while True:
            msg = await self.to_send.get()
            await ws.send(json.dumps(msg))

    async def _receive(self, ws: ServerConnection) -> None:
        frames = 0
        async for raw in ws:
            msg = json.loads(raw)
            if msg["type"] != "logs":
                self.received.append(msg)
                if msg["type"] == "job_accepted" and self.confirm:
                    await ws.send(json.dumps({"type": "job_confirmed", "job": msg["job"], "attempt": msg["attempt"]}))
                self.changed.set()
                continue
            frames += 1
            stored = self.stored.setdefault(msg["job"], [])
            self.first_log_at.setdefault(msg["job"], time.monotonic())
            for i, line in enumerate(chunk_lines(msg["streams"], msg["times"], msg["text"])):
                if msg["first_seq"] + i == len(stored) + 1:
                    stored.append(line)
            if self.cuts and frames == self.cuts[0]:
                # Stored but not acknowledged: the runner must resend and we dedupe.
                self.cuts.pop(0)
                if len(self.cuts) % 2:
                    ws.transport.abort()
                else:
                    await ws.close(1012, "restart")
                return
            await ws.send(json.dumps({"type": "log_ack", "job": msg["job"], "seq": len(stored)}))
            self.changed.set()

    def states(self, job: str) -> list[tuple[str, int | None]]:
        return [(m["state"], m["exit_code"]) for m in self.received if m["type"] == "job_state" and m["job"] == job]

    async def wait_for(self, predicate: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; received {self.received[-5:]}"
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.2))


# No server answers there: a job that calls the API says so.
DEAD_API = "http://127.0.0.1:9/api/v1"


def assign(job: str, commands: list[str], repo: tuple[Path, str]) -> dict[str, Any]:
    path, commit = repo
    return {
        "type": "assign_job",
        "job": job,
        "attempt": 1,
        "seq_base": 0,
        "lease": f"lease-{job}",
        "lease_seconds": 10,
        "run_name": "r1",
        "workflow": "w",
        "commands": commands,
        "env": {"LINES": "100000"},
        "code": {"kind": "git", "repo_url": str(path), "commit": commit},
        "artifacts": [],
        "api_url": DEAD_API,
    }


async def start_runner(
    port: int,
    work: Path,
    *extra: str,
    token: str = TOKEN,
    outlive: bool = False,
    api_url: str = "",
    env: dict[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """A real runner; by default its jobs die with it (``--no-jobs-outlive-runner``,
    as the local backend starts it), so a test that kills it leaves nothing behind.
    ``api_url``: where its jobs' REST calls go when that is not the fake
    server (a file server): the only origin it then sends its token to.
    ``env``: variables over this process's (a PATH with a stand-in nvidia-smi)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "trainyard_runner",
        "--server",
        f"ws://127.0.0.1:{port}",
        "--work-dir",
        str(work),
        "--jobs-outlive-runner" if outlive else "--no-jobs-outlive-runner",
        *(("--api-origin", api_url) if api_url else ()),
        *extra,
        env={**os.environ, **(env or {}), "TRAINYARD_RUNNER_TOKEN": token},
        stderr=asyncio.subprocess.PIPE,
    )


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


NOISY = (
    f'{sys.executable} -c "import os,sys\n'
    "for i in range(int(os.environ['LINES'])): sys.stdout.write(f'line {i:09d} the quick brown fox\\\\n')\""
)


def test_a_job_streams_every_line_exactly_once_across_connection_cuts(tmp_path: Path, repo: tuple[Path, str]) -> None:
    async def go() -> tuple[FakeServer, float]:
        server = FakeServer(cut_after_frames=[1, 2, 1, 1])
        async with serve(server.handler, "127.0.0.1", 0, max_size=None) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            runner = await start_runner(port, tmp_path / "rd")
            try:
                await server.wait_for(lambda: server.hellos, 10)
                await server.to_send.put(assign("job1", ["echo start", NOISY, "echo bye >&2"], repo))
                await server.wait_for(lambda: ("succeeded", 0) in server.states("job1"), 60)
                # A warm runner: the repository is cached now.
                sent = time.monotonic()
                await server.to_send.put(assign("job2", ["echo hi"], repo))
                await server.wait_for(lambda: ("succeeded", 0) in server.states("job2"), 10)
                latency = server.first_log_at["job2"] - sent
                await server.to_send.put({"type": "shutdown", "reason": "idle"})
                assert await asyncio.wait_for(runner.wait(), 10) == 0
            finally:
                await stop(runner)
        return server, latency

    server, latency = asyncio.run(go())
    texts = [(stream, text) for _, stream, text in server.stored["job1"]]
    assert texts == [("o", "start")] + [("o", f"line {i:09d} the quick brown fox") for i in range(100000)] + [
        ("e", "bye")
    ]
    assert (server.cuts, server.connections) == ([], 5)
    # The latest state is re-sent after every reconnect (the server treats a
    # repeated state as a no-op), so compare the transitions.
    transitions = [s for i, s in enumerate(server.states("job1")) if i == 0 or server.states("job1")[i - 1] != s]
    assert transitions == [("preparing", None), ("running", None), ("uploading", None), ("succeeded", 0)]
    accepted = [m for m in server.received if m["type"] == "job_accepted"]
    assert accepted == [
        {"type": "job_accepted", "job": "job1", "attempt": 1, "lease": "lease-job1", "ports": []},
        {"type": "job_accepted", "job": "job2", "attempt": 1, "lease": "lease-job2", "ports": []},
    ]
    assert [[j["job"] for j in h["running_jobs"]] for h in server.hellos] == [
        [],
        ["job1"],
        ["job1"],
        ["job1"],
        ["job1"],
    ]
    assert server.hellos[0]["resources"]["cpus"] == os.cpu_count()
    assert [(s, t) for _, s, t in server.stored["job2"]] == [("o", "hi")]
    assert latency < 0.5, latency


def test_the_fail_workflow_reports_exit_code_3(tmp_path: Path, repo: tuple[Path, str]) -> None:
    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                await server.to_send.put(assign("j", ['echo "about to fail" >&2', "exit 3"], repo))
                await server.wait_for(lambda: server.states("j")[-1:] == [("failed", 3)], 20)
            finally:
                await stop(runner)
        return server

    server = asyncio.run(go())
    assert [(s, t) for _, s, t in server.stored["j"]] == [("e", "about to fail")]
    assert [m["reason"] for m in server.received if m.get("state") == "failed"] == ["exit code 3"]


def test_commands_wait_for_the_confirmation_and_a_lost_one_never_runs_them_twice(
    tmp_path: Path, repo: tuple[Path, str], drop: Path
) -> None:
    """The acceptance is "lost" (no job_confirmed): the code is prepared but
    nothing runs. After a reconnect the welcome confirms the held attempt and
    the commands run exactly once (a marker file counts the runs)."""
    marker = drop / "ran"

    async def go() -> tuple[FakeServer, bool, list[str]]:
        server = FakeServer()
        server.confirm = False
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                await server.to_send.put(assign("j", [f"echo run >> {marker}", "echo done"], repo))
                await server.wait_for(lambda: ("preparing", None) in server.states("j"), 20)
                await asyncio.sleep(1.5)
                ran_before = marker.exists()
                held = []
                server.confirm = True
                assert server.current is not None
                await server.current.close(1012, "restart")
                await server.wait_for(lambda: server.states("j")[-1:] == [("succeeded", 0)], 20)
                held = [h["running_jobs"] for h in server.hellos]
            finally:
                await stop(runner)
        return server, ran_before, held

    server, ran_before, held = asyncio.run(go())
    assert ran_before is False
    assert held[1] == [{"job": "j", "attempt": 1, "lease": "lease-j", "confirmed": False, "ports": []}]
    assert marker.read_text() == "run\n"
    assert [t for _, _, t in server.stored["j"]] == ["done"]


def test_cancel_stops_the_job_and_reports_stopped(tmp_path: Path, repo: tuple[Path, str]) -> None:
    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                await server.to_send.put(assign("j", ["echo up", "sleep 1000 & sleep 1000; wait"], repo))
                await server.wait_for(lambda: "j" in server.stored, 20)
                await server.to_send.put(assign("k", ["echo other"], repo))
                await server.wait_for(lambda: any(m["type"] == "job_rejected" for m in server.received), 10)
                await server.to_send.put({"type": "cancel_job", "job": "unknown"})
                await server.to_send.put({"type": "cancel_job", "job": "j", "reason": "user"})
                await server.wait_for(lambda: server.states("j")[-1:] == [("stopped", 143)], 10)
            finally:
                await stop(runner)
        return server

    server = asyncio.run(go())
    assert server.states("j") == [("preparing", None), ("running", None), ("stopped", 143)]
    rejected = [m for m in server.received if m["type"] == "job_rejected"]
    assert rejected == [
        {"type": "job_rejected", "job": "k", "attempt": 1, "lease": "lease-k", "reason": "busy with job j"}
    ]


def test_a_cancel_with_a_grace_is_announced_in_the_interrupt_file_and_waited_for(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    """The budget's stop: the job reads why and by when in its interrupt
    file, and gets the grace (here 8 s, past CANCEL_GRACE's 5) to finish
    writing before it is killed; it exits 0 by itself, reported ``stopped``."""
    trap = 'trap \'. "$TRAINYARD_INTERRUPT_FILE"; sleep 6; echo "told: $TRAINYARD_INTERRUPT_ACTION"; exit 0\' TERM'

    async def go() -> tuple[FakeServer, float]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                job = [trap, "echo armed", "while true; do sleep 0.2 || true; done"]
                await server.to_send.put(assign("j", job, repo))
                # "running" is told when the shell starts, before it has read the trap.
                await server.wait_for(lambda: "armed" in [t for _, _, t in server.stored.get("j", [])], 20)
                assert server.states("j") == [("preparing", None), ("running", None)], server.received
                started = time.monotonic()
                await server.to_send.put({"type": "cancel_job", "job": "j", "reason": "budget", "grace": 8})
                await server.wait_for(lambda: server.states("j")[-1:] == [("stopped", 0)], 20)
                took = time.monotonic() - started
            finally:
                await stop(runner)
        return server, took

    server, took = asyncio.run(go())
    assert [t for _, _, t in server.stored["j"]][-1:] == ["told: stop"]
    assert 6 <= took < 12, took


def test_an_idle_runner_heartbeats_and_exits_0_on_shutdown(tmp_path: Path) -> None:
    async def go() -> tuple[FakeServer, int]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                await server.wait_for(lambda: len([m for m in server.received if m["type"] == "heartbeat"]) >= 2, 5)
                await server.to_send.put({"type": "shutdown", "reason": "idle"})
                code = await asyncio.wait_for(runner.wait(), 10)
            finally:
                await stop(runner)
        return server, code

    server, code = asyncio.run(go())
    assert code == 0
    assert {json.dumps(m) for m in server.received} == {'{"type": "heartbeat", "state": "idle"}'}
    assert server.hellos[0]["type"] == "hello" and server.hellos[0]["protocol"] == PROTOCOL_VERSION


def test_a_clone_failure_fails_the_job_with_the_reason(tmp_path: Path) -> None:
    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                await server.to_send.put(assign("j", ["echo never"], (tmp_path / "missing", "a" * 40)))
                await server.wait_for(lambda: server.states("j")[-1:] == [("failed", None)], 20)
            finally:
                await stop(runner)
        return server

    server = asyncio.run(go())
    [failed] = [m for m in server.received if m.get("state") == "failed"]
    assert failed["reason"].startswith(f"clone of {tmp_path / 'missing'} failed (exit 128): ")
    assert "j" not in server.stored


def test_a_refused_token_exits_with_code_2(tmp_path: Path) -> None:
    async def go() -> tuple[int, bytes]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd", token="wrong")
            try:
                code = await asyncio.wait_for(runner.wait(), 10)
            finally:
                await stop(runner)
            return code, await runner.stderr.read()  # type: ignore[union-attr]

    code, err = asyncio.run(go())
    assert code == 2
    assert b"trainyard-runner: server refused this runner: close code 4401 bad token; exiting" in err


def test_a_hello_refused_because_another_connection_is_live_is_retried_not_fatal(tmp_path: Path) -> None:
    """4412: the server still holds this runner's old socket (a network blip);
    the runner keeps trying and gets in once that one has gone silent."""
    reason = "runner local-x is connected and heartbeating elsewhere; retry after 15s of its silence"

    async def go() -> tuple[FakeServer, int | None]:
        server = FakeServer()
        server.refuse_hellos = [(CLOSE_IN_USE, reason), (CLOSE_IN_USE, reason)]
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                await server.wait_for(lambda: len(server.hellos) == 3 and server.current is not None, 20)
                await server.wait_for(lambda: any(m["type"] == "heartbeat" for m in server.received), 10)
            finally:
                code = runner.returncode
                await stop(runner)
        return server, code

    server, code = asyncio.run(go())
    assert code is None, "the runner was still running after two refusals"
    assert server.connections == 3


def test_an_unreachable_server_makes_an_idle_runner_give_up(tmp_path: Path) -> None:
    async def go() -> tuple[int, float]:
        started = time.monotonic()
        runner = await start_runner(9, tmp_path / "rd", "--give-up-after", "1")
        try:
            return await asyncio.wait_for(runner.wait(), 15), time.monotonic() - started
        finally:
            await stop(runner)

    code, took = asyncio.run(go())
    assert code == 1
    assert 1 <= took < 10


def test_a_job_that_ends_while_the_server_is_away_keeps_the_runner_until_its_final_state_is_delivered(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    """Idle for --give-up-after, but holding a final state: the runner
    waits for the server instead of leaving (the server would count the job
    lost and run it again), and delivers it once the server is back."""

    async def go() -> tuple[int | None, FakeServer]:
        first, back, port = FakeServer(), FakeServer(), _free_port()
        async with serve(first.handler, "127.0.0.1", port) as ws_server:
            runner = await start_runner(port, tmp_path / "rd", "--give-up-after", "1")
            await first.to_send.put(assign("j", ["sleep 1"], repo))
            await first.wait_for(lambda: ("running", None) in first.states("j"), 20)
            ws_server.close()  # the server goes away; the job ends a second later
        try:
            await asyncio.sleep(5)
            if runner.returncode is not None:
                return runner.returncode, back
            async with serve(back.handler, "127.0.0.1", port):
                await back.wait_for(lambda: ("succeeded", 0) in back.states("j"), 20)
        finally:
            await stop(runner)
        return None, back

    exited, back = asyncio.run(go())
    assert exited is None
    assert [h["job"] for h in back.hellos[0]["running_jobs"]] == ["j"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_without_outlive_the_job_and_its_background_children_die_with_a_sigkilled_runner(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    async def go() -> list[int]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                await server.to_send.put(assign("j", ["echo $$", "sleep 1000 & echo $!", "wait"], repo))
                await server.wait_for(lambda: len(server.stored.get("j", [])) >= 2, 20)
                runner.kill()
                await runner.wait()
            finally:
                await stop(runner)
        return [int(line[2]) for line in server.stored["j"][:2]]

    pids = asyncio.run(go())  # bash, and the sleep it started in the background
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [pid for pid in pids if _alive(pid)] == []


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and _state(pid) not in {"Z", "gone"}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def _run_jobs(tmp_path: Path, *jobs: dict[str, Any], extra: tuple[str, ...] = ()) -> FakeServer:
    """Run each assigned job to its final state on a real runner."""

    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            api_url = next((job["api_url"] for job in jobs if job["api_url"] != DEAD_API), "")
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd", *extra, api_url=api_url)
            try:
                for job in jobs:
                    await server.to_send.put(job)
                    await server.wait_for(partial(_ended, server, job["job"]), 20)
            finally:
                await stop(runner)
        return server

    return asyncio.run(go())


def _ended(server: FakeServer, job: str) -> bool:
    return any(state in ("succeeded", "failed", "stopped") for state, _ in server.states(job))


def _job_states(server: FakeServer, job: str) -> list[tuple[str, int | None, str]]:
    return [(m["state"], m["exit_code"], m["reason"]) for m in server.received if m.get("job") == job and "state" in m]


def test_inputs_are_in_place_before_the_commands_run_and_pip_shares_a_cache_only_under_one_user(
    tmp_path: Path, repo: tuple[Path, str], file_server: Any
) -> None:
    url, size, sha = file_server.add("/weights.json", b'{"w": [1, 2]}\n')
    job = assign("j", ["cat base_model/weights.json", 'echo "$PIP_CACHE_DIR"'], repo)
    file_server.serve_input(job, "./base_model", [{"path": "weights.json", "size": size, "sha256": sha, "url": url}])
    own_cache = assign("k", ['echo "$PIP_CACHE_DIR"'], repo)
    own_cache["env"] = {"PIP_CACHE_DIR": "/tmp/mine"}

    server = _run_jobs(tmp_path, job, own_cache)

    assert _job_states(server, "j") == [
        ("preparing", None, ""),
        ("preparing", None, "fetching inputs (1 file, 0.0 MB)"),
        ("running", None, ""),
        ("uploading", None, ""),
        ("succeeded", 0, ""),
    ]
    # A root runner's jobs have users of their own: pip's cache is in each one's home, never shared.
    shared = "" if os.geteuid() == 0 else str(tmp_path / "rd" / "pip-cache")
    assert [t for _, _, t in server.stored["j"]] == ['{"w": [1, 2]}', shared]
    assert [t for _, _, t in server.stored["k"]] == ["/tmp/mine"]


def test_secrets_are_fetched_over_rest_and_the_assignments_env_wins_over_them(
    tmp_path: Path, repo: tuple[Path, str], file_server: Any
) -> None:
    job = assign("j", ['echo "$API_KEY $LINES"'], repo)
    job["secrets"] = True
    job["api_url"] = f"{file_server.base}/api/v1"
    secrets = {"env": {"API_KEY": "from-rest-1234", "LINES": "from-secret"}, "credential": None}
    file_server.files["/api/v1/runner/jobs/j/secrets/"] = json.dumps(secrets).encode()
    refused = assign("k", ["echo never"], repo)
    refused["secrets"] = True
    refused["api_url"] = f"{file_server.base}/api/v1"
    file_server.faults["/api/v1/runner/jobs/k/secrets/"] = [409]

    server = _run_jobs(tmp_path, job, refused)

    assert [t for _, _, t in server.stored["j"]] == ["from-rest-1234 100000"]
    assert (
        not (tmp_path / "rd" / "jobs" / "j" / "job.json").exists()
        or "from-rest" not in (tmp_path / "rd" / "jobs" / "j" / "job.json").read_text()
    )
    final = _job_states(server, "k")[-1]
    assert final[:2] == ("failed", None) and final[2].startswith("could not fetch the job's secrets: GET http://")
    assert "k" not in server.stored


def test_an_input_with_a_wrong_digest_fails_the_job_before_the_commands(
    tmp_path: Path, repo: tuple[Path, str], file_server: Any
) -> None:
    url, size, _ = file_server.add("/weights.json", b"{}")
    job = assign("j", ["echo never"], repo)
    file_server.serve_input(
        job, "./base_model", [{"path": "weights.json", "size": size, "sha256": "0" * 64, "url": url}]
    )
    server = _run_jobs(tmp_path, job)
    assert _job_states(server, "j")[-1] == (
        "failed",
        None,
        "could not fetch input ./base_model/weights.json: sha256 mismatch",
    )
    assert "running" not in [s for s, _ in server.states("j")]
    assert "j" not in server.stored


def test_the_docker_provider_without_an_engine_fails_the_job_with_the_reason(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    job = assign("j", ["echo never"], repo)
    job.update(provider="docker", image="python:3.12-slim")
    server = _run_jobs(tmp_path, job)
    *_, (state, code, reason) = _job_states(server, "j")
    assert (state, code) == ("failed", None)
    assert reason.startswith(
        "the docker provider needs a Docker engine on the runner's machine; `docker info` failed: "
    )
    assert "j" not in server.stored


def test_hello_carries_the_address(tmp_path: Path, repo: tuple[Path, str]) -> None:
    server = _run_jobs(tmp_path, assign("j", ["true"], repo))
    assert server.hellos[0]["address"] == "127.0.0.1"  # the server is on loopback
    server = _run_jobs(tmp_path, assign("j", ["true"], repo), extra=("--address", "10.1.2.3"))
    assert server.hellos[0]["address"] == "10.1.2.3"


def test_a_cancel_while_fetching_inputs_stops_the_job(tmp_path: Path, repo: tuple[Path, str], file_server: Any) -> None:
    url, size, sha = file_server.add("/big", b"x" * 200_000)  # 10 s at the "slow" rate
    file_server.faults["/big"] = ["slow"]
    job = assign("j", ["echo never"], repo)
    file_server.serve_input(job, "in", [{"path": "big", "size": size, "sha256": sha, "url": url}])

    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd", api_url=job["api_url"])
            try:
                await server.to_send.put(job)
                await server.wait_for(lambda: len(server.states("j")) == 2, 20)
                await server.to_send.put({"type": "cancel_job", "job": "j", "reason": "user"})
                await server.wait_for(lambda: server.states("j")[-1:] == [("stopped", None)], 5)
                await server.to_send.put({"type": "shutdown"})
                assert await asyncio.wait_for(runner.wait(), 5) == 0
            finally:
                await stop(runner)
        return server

    server = asyncio.run(go())
    assert _job_states(server, "j") == [
        ("preparing", None, ""),
        ("preparing", None, "fetching inputs (1 file, 0.2 MB)"),
        ("stopped", None, "user"),
    ]
    assert not (tmp_path / "rd" / "jobs" / "j").exists()


FAKE_DOCKER = """#!/bin/bash
# Stands in for the docker client: records its calls; "run" executes the script with bash.
echo "$*" >> "$DOCKER_LOG"
case "$1" in
  info) echo 27.0.1 ;;
  run)
    for ((i = 1; i <= $#; i++)); do
      if [ "${!i}" = --env-file ]; then
        j=$((i + 1)); f=${!j}; stat -c %a "$f" >> "$DOCKER_LOG"; cat "$f" >> "$DOCKER_LOG"
        while IFS= read -r line; do export "$line"; done < "$f"
      fi
    done
    exec bash -c "${@: -1}" ;;
esac
"""


def test_a_docker_job_runs_through_the_client_with_its_env_file_and_is_killed_on_cancel(
    tmp_path: Path, repo: tuple[Path, str], monkeypatch: Any
) -> None:
    """No engine here: a fake ``docker`` on PATH checks what the runner asks of it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    calls = tmp_path / "docker.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_LOG", str(calls))
    ok = assign("d1", ['echo "steps=$STEPS"'], repo)
    ok.update(provider="docker", image="python:3.12-slim", env={"STEPS": "20"})
    slow = assign("d2", ["echo up", "sleep 1000"], repo)
    slow.update(provider="docker", image="python:3.12-slim", env={})

    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                await server.to_send.put(ok)
                await server.wait_for(partial(_ended, server, "d1"), 20)
                await server.to_send.put(slow)
                await server.wait_for(lambda: "d2" in server.stored, 20)
                await server.to_send.put({"type": "cancel_job", "job": "d2"})
                await server.wait_for(partial(_ended, server, "d2"), 20)
            finally:
                await stop(runner)
        return server

    server = asyncio.run(go())
    assert server.states("d1")[-1] == ("succeeded", 0)
    assert [t for _, _, t in server.stored["d1"]] == ["steps=20"]
    assert server.states("d2")[-1][0] == "stopped"
    work = tmp_path / "rd" / "jobs" / "d1" / "work"
    env_file = tmp_path / "rd" / "jobs" / "d1" / "tmp" / "docker.env"
    interrupt = tmp_path / "rd" / "jobs" / "d1" / "interrupt"
    metrics = tmp_path / "rd" / "jobs" / "d1" / "metrics"
    lines = calls.read_text().splitlines()
    assert lines[:6] == [
        "info --format {{.ServerVersion}}",
        "rm -f trainyard-d1",
        f"run --rm --network host --name trainyard-d1 -v {work}:/workdir -w /workdir"
        f" -v {interrupt}:/run/trainyard:ro -v {metrics}:/run/trainyard-metrics"
        f" --env-file {env_file} -- python:3.12-slim bash -c set -e",
        'echo "steps=$STEPS"',
        "",
        "600",
    ]
    assert lines[6:12] == [
        "WANDB_RUN_ID=d1",
        "WANDB_RESUME=allow",
        "STEPS=20",
        "PYTHONUNBUFFERED=1",
        "TRAINYARD_INTERRUPT_FILE=/run/trainyard/interrupt.env",
        "TRAINYARD_METRICS_FILE=/run/trainyard-metrics/metrics.jsonl",
    ]
    assert lines[-1] == "kill trainyard-d2"


def test_a_server_of_a_newer_protocol_makes_the_runner_exit_2_saying_what_to_upgrade(tmp_path: Path) -> None:
    async def go() -> tuple[int, str]:
        server = FakeServer()
        server.welcome_extra = {"protocol": PROTOCOL_VERSION + 1}
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                code = await asyncio.wait_for(runner.wait(), 20)
            finally:
                await stop(runner)
            assert runner.stderr is not None
            return code, (await runner.stderr.read()).decode()

    code, stderr = asyncio.run(go())
    assert code == 2
    assert (
        f"server speaks protocol {PROTOCOL_VERSION + 1}, runner {PROTOCOL_VERSION}: upgrade trainyard-runner" in stderr
    )


def _standby_of(runner_pid: int) -> int | None:
    """The pid of the runner's waiting standby shim (``_shim.py JOBS/ standby``), if one waits."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == runner_pid and b"standby" in argv:
            return int(entry.name)
    return None


def test_each_job_starts_in_the_standby_shim_the_runner_started_ahead_of_it(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    async def go() -> tuple[list[int], FakeServer]:
        server = FakeServer()
        waiting: list[int] = []
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], tmp_path / "rd")
            try:
                for job in ("j1", "j2"):  # filled at the runner's start, then again after j1
                    await server.wait_for(lambda: _standby_of(runner.pid) not in (None, *waiting), 20)
                    waiting.append(_standby_of(runner.pid) or 0)
                    await server.to_send.put(assign(job, ['echo "$PPID"'], repo))
                    await server.wait_for(lambda job=job: server.states(job)[-1:] == [("succeeded", 0)], 20)
            finally:
                await stop(runner)
        return waiting, server

    waiting, server = asyncio.run(go())
    # The commands' parent is the shim: the one that was already waiting.
    assert [int(server.stored[job][0][2]) for job in ("j1", "j2")] == waiting

"""A runner process that dies (SIGKILL) and is started again on the same work
dir re-attaches to the jobs its shims still run: real runner processes, real
jobs, and the small fake server of test_agent.py."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

from trainyard_runner.logstream import LogStream, read_spool
from trainyard_runner.process import Execution, ShimRecord, job_env, read_exit
from trainyard_runner.reattach import lock_work_dir
from websockets.asyncio.server import serve

from tests.runner.test_agent import FakeServer, _alive, assign, start_runner, stop

# Prints its pid, then 1..N, one line every 50 ms; counts its runs in $MARKER.
COUNT = ["echo started >> $MARKER", "echo pid=$$", "for i in $(seq 1 $N); do echo line $i; sleep 0.05; done"]


def _job(job: str, repo: tuple[Path, str], marker: Path, n: int) -> dict[str, Any]:
    frame = assign(job, COUNT, repo)
    frame["env"] = {"MARKER": str(marker), "N": str(n)}
    return frame


def _texts(server: FakeServer, job: str) -> list[str]:
    return [line[2] for line in server.stored.get(job, [])]


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_sigkilled_runner_restarted_on_its_work_dir_finishes_the_job_with_every_line_once(
    tmp_path: Path, repo: tuple[Path, str], drop: Path
) -> None:
    marker, n = drop / "marker", 60

    async def go() -> tuple[FakeServer, int, bool]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            first = await start_runner(port, tmp_path / "rd", outlive=True)
            second = None
            try:
                await server.to_send.put(_job("j", repo, marker, n))
                await server.wait_for(lambda: len(server.stored.get("j", [])) >= 10, 20)
                first.kill()
                await first.wait()
                pid = int(_texts(server, "j")[0].removeprefix("pid="))
                alive_between = _alive(pid)  # the job did not die with its runner
                await asyncio.sleep(0.5)  # lines go on to the output file meanwhile
                second = await start_runner(port, tmp_path / "rd", outlive=True)
                await server.wait_for(lambda: any(s[0] == "succeeded" for s in server.states("j")), 30)
                job_dir = tmp_path / "rd" / "jobs" / "j"
                await asyncio.to_thread(_wait, lambda: not job_dir.exists(), 5, "the job's files to be removed")
            finally:
                await stop(first)
                if second is not None:
                    await stop(second)
        return server, pid, alive_between

    server, pid, alive_between = asyncio.run(go())
    assert alive_between
    assert _texts(server, "j") == [f"pid={pid}", *(f"line {i}" for i in range(1, n + 1))]
    assert marker.read_text() == "started\n"  # the commands ran once
    [_, hello] = server.hellos
    assert hello["running_jobs"] == [{"job": "j", "attempt": 1, "lease": "lease-j", "confirmed": True, "ports": []}]
    assert server.states("j")[-1] == ("succeeded", 0)


def test_a_job_that_ended_while_no_runner_ran_is_reported_by_the_next_one(
    tmp_path: Path, repo: tuple[Path, str], drop: Path
) -> None:
    marker = drop / "marker"

    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            first = await start_runner(port, tmp_path / "rd", outlive=True)
            second = None
            try:
                frame = assign("j", [*COUNT, "exit 3"], repo)
                frame["env"] = {"MARKER": str(marker), "N": "20"}
                await server.to_send.put(frame)
                await server.wait_for(lambda: len(server.stored.get("j", [])) >= 2, 20)
                first.kill()
                await first.wait()
                await asyncio.to_thread(
                    _wait, lambda: read_exit(tmp_path / "rd" / "jobs" / "j") is not None, 10, "exit"
                )
                second = await start_runner(port, tmp_path / "rd", outlive=True)
                await server.wait_for(lambda: any(s[0] == "failed" for s in server.states("j")), 30)
            finally:
                await stop(first)
                if second is not None:
                    await stop(second)
        return server

    server = asyncio.run(go())
    assert server.states("j")[-1] == ("failed", 3)
    assert _texts(server, "j")[1:] == [f"line {i}" for i in range(1, 21)]
    assert marker.read_text() == "started\n"


def test_a_refused_reattached_job_has_its_process_group_killed_and_its_files_removed(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    async def go() -> tuple[FakeServer, int]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            first = await start_runner(port, tmp_path / "rd", outlive=True)
            second = None
            try:
                await server.to_send.put(assign("j", ["echo pid=$$", "sleep 1000 & echo bg=$!", "wait"], repo))
                await server.wait_for(lambda: len(server.stored.get("j", [])) >= 2, 20)
                first.kill()
                await first.wait()
                server.welcome_extra = {"refused": ["j"], "confirmed": []}  # another attempt is current now
                received = len(server.received)
                second = await start_runner(port, tmp_path / "rd", outlive=True)
                job_dir = tmp_path / "rd" / "jobs" / "j"
                await server.wait_for(lambda: len(server.hellos) == 2 and not job_dir.exists(), 20)
                # The refused attempt sends nothing more: no state, no final.
                assert [m["type"] for m in server.received[received:]] == []
            finally:
                await stop(first)
                if second is not None:
                    await stop(second)
        return server, 0

    server, _ = asyncio.run(go())
    pids = [int(t.split("=")[1]) for t in _texts(server, "j")[:2]]  # bash, and the sleep in the background
    _wait(lambda: not any(_alive(pid) for pid in pids), 10, "the refused job's processes to end")


def test_sigterm_with_outlive_leaves_the_job_running_and_the_next_runner_finishes_it(
    tmp_path: Path, repo: tuple[Path, str], drop: Path
) -> None:
    marker = drop / "marker"

    async def go() -> tuple[FakeServer, int | None]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            first = await start_runner(port, tmp_path / "rd", outlive=True)
            second = None
            try:
                await server.to_send.put(_job("j", repo, marker, 40))
                await server.wait_for(lambda: len(server.stored.get("j", [])) >= 5, 20)
                first.send_signal(signal.SIGTERM)
                code = await asyncio.wait_for(first.wait(), 10)
                second = await start_runner(port, tmp_path / "rd", outlive=True)
                await server.wait_for(lambda: any(s[0] == "succeeded" for s in server.states("j")), 30)
            finally:
                await stop(first)
                if second is not None:
                    await stop(second)
        return server, code

    server, code = asyncio.run(go())
    assert code == 0
    assert [s for s in server.states("j") if s[0] == "stopped"] == []
    assert _texts(server, "j")[1:] == [f"line {i}" for i in range(1, 41)]
    assert marker.read_text() == "started\n"


def test_output_is_read_on_from_the_spooled_offsets_without_a_gap_or_a_duplicate(tmp_path: Path) -> None:
    """The reading side of a runner stops mid-job (as if it died); another one
    resumes from the spool: every line once, in order, numbered on."""
    n = 400
    commands = [f"for i in $(seq 1 {n}); do echo out $i; echo err $i >&2; sleep 0.002; done"]

    async def first_half() -> ShimRecord:
        stream = LogStream("j", tmp_path / "spool.jsonl", first_seq=11)  # attempt 2: seqs go on from 10
        await Execution.start(commands, job_dir=tmp_path, cwd=tmp_path, env=job_env({}), stream=stream, outlive=True)
        while stream.last_seq < 10 + n // 2:
            await asyncio.sleep(0.01)
        record = ShimRecord.load(tmp_path)
        assert record is not None and record.alive()
        return record  # leaving the loop cancels the readers: the runner "dies" here

    async def second_half(record: ShimRecord) -> int:
        stream = LogStream("j", tmp_path / "spool.jsonl", first_seq=11, resume=True)
        assert set(stream.offsets) == {"o", "e"}
        ex = Execution.attach(tmp_path, record, stream, stream.offsets)
        return await asyncio.wait_for(ex.wait(), 30)

    record = asyncio.run(first_half())
    # A torn last record (the runner died mid-write) is cut off and its lines read again.
    with open(tmp_path / "spool.jsonl", "a") as spool:
        spool.write('[999, 1.0, "o", ["torn')
    code = asyncio.run(second_half(record))

    assert code == 0
    assert json.loads((tmp_path / "exit.json").read_text())["code"] == 0
    lines = list(read_spool(tmp_path / "spool.jsonl"))
    assert [seq for seq, _ in lines] == list(range(11, 11 + 2 * n))
    for name, prefix in (("o", "out"), ("e", "err")):
        assert [t for _, (_, st, t) in lines if st == name] == [f"{prefix} {i}" for i in range(1, n + 1)]


def test_the_shim_writes_the_exit_code_and_keeps_running_without_its_parent(tmp_path: Path) -> None:
    async def go() -> int:
        stream = LogStream("j", tmp_path / "spool.jsonl")
        ex = await Execution.start(
            ["echo hi", "exit 7"], job_dir=tmp_path, cwd=tmp_path, env=job_env({}), stream=stream, outlive=True
        )
        return await asyncio.wait_for(ex.wait(), 10)

    assert asyncio.run(go()) == 7
    assert json.loads((tmp_path / "exit.json").read_text())["code"] == 7
    assert (tmp_path / "stdout.log").read_text() == "hi\n"


def test_two_runner_processes_never_share_a_work_dir(tmp_path: Path) -> None:
    async def go() -> tuple[bool, bool]:
        first = await lock_work_dir(tmp_path, wait=0)
        second = await lock_work_dir(tmp_path, wait=0.3)  # as another process would: its own open file
        assert first is not None
        first.close()  # the first runner is gone
        third = await lock_work_dir(tmp_path, wait=0.3)
        return second is None, third is not None

    assert asyncio.run(go()) == (True, True)

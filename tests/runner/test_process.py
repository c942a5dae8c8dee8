from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainyard_runner.logstream import LogStream, read_spool
from trainyard_runner.process import MAX_LINE_BYTES, Execution, ShimStandby, job_env
from trainyard_runner.protocol import may_be_cut


def _run(
    commands: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[int, list[tuple[int, str, str]]]:
    async def go() -> int:
        stream = LogStream("j", tmp_path / "spool")
        ex = await Execution.start(commands, job_dir=tmp_path, cwd=tmp_path, env=job_env(env or {}), stream=stream)
        return await asyncio.wait_for(ex.wait(), 30)

    code = asyncio.run(go())
    return code, [(seq, st, t) for seq, (_, st, t) in read_spool(tmp_path / "spool")]


def test_the_fail_workflow_ends_with_exit_code_3(tmp_path: Path) -> None:
    code, lines = _run(['echo "about to fail" >&2', "exit 3", "echo never"], tmp_path)
    assert code == 3
    assert lines == [(1, "e", "about to fail")]


def test_the_first_failing_command_ends_the_job(tmp_path: Path) -> None:
    code, lines = _run(["echo one", "false", "echo two"], tmp_path)
    assert (code, lines) == (1, [(1, "o", "one")])


def test_output_is_split_into_numbered_lines(tmp_path: Path) -> None:
    long = "x" * (MAX_LINE_BYTES + 10)
    code, lines = _run(["printf 'a\\n\\nb'", "echo", f"echo {long}", "printf 'caf\\xc3\\xa9 \\xff\\n'"], tmp_path)
    assert code == 0
    assert lines == [
        (1, "o", "a"),
        (2, "o", ""),
        (3, "o", "b"),
        (4, "o", "x" * MAX_LINE_BYTES),
        (5, "o", "x" * 10),
        (6, "o", "café \ufffd"),
    ]


def test_a_long_line_is_cut_between_characters_into_pieces_the_server_recognises(tmp_path: Path) -> None:
    # Byte 65,536 of this line is the second half of an "é" (2 bytes): the
    # first cut moves one byte back, so no character is split in two.
    text = "x" * 21_845 + "é" * 60_000 + "end"
    write = "import sys; sys.stdout.buffer.write(('x' * 21_845 + 'é' * 60_000 + 'end\\n').encode())"
    code, lines = _run([f'{sys.executable} -c "{write}"'], tmp_path)
    texts = [t for _, _, t in lines]
    assert code == 0
    assert texts[0] == "x" * 21_845 + "é" * 21_845  # 65,535 bytes
    assert "".join(texts) == text  # nothing lost or replaced by U+FFFD
    assert [may_be_cut(t) for t in texts] == [True] * (len(texts) - 1) + [False]


def test_the_job_gets_its_env_without_the_runner_token(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TRAINYARD_RUNNER_TOKEN", "secret")
    code, lines = _run(['echo "${TRAINYARD_RUNNER_TOKEN:-none} $STEPS $PYTHONUNBUFFERED"'], tmp_path, {"STEPS": "20"})
    assert (code, lines) == (0, [(1, "o", "none 20 1")])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _group(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(entry.name))
    return pids


def _group_after_exit(pgid: int) -> list[int]:
    # A killed process closes its pipes (our EOF) a moment before it is gone.
    deadline = time.monotonic() + 2
    while (pids := _group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return pids


def test_terminate_kills_the_whole_process_group(tmp_path: Path) -> None:
    async def go() -> tuple[int, list[int], list[int]]:
        stream = LogStream("j", tmp_path / "spool")
        ex = await Execution.start(
            ["sleep 1000 & sleep 1000; wait"], job_dir=tmp_path, cwd=tmp_path, env=job_env({}), stream=stream
        )
        deadline = time.monotonic() + 5
        while len(_group(ex.pid)) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        before = _group(ex.pid)
        started = time.monotonic()
        await ex.terminate(grace=5)
        code = await asyncio.wait_for(ex.wait(), 10)
        assert time.monotonic() - started < 2  # SIGTERM was enough
        return code, before, _group_after_exit(ex.pid)

    code, before, after = asyncio.run(go())
    assert len(before) == 4  # the shim, bash and both sleeps
    assert after == []
    assert code == 128 + 15


def test_terminate_kills_after_the_grace_period_when_sigterm_is_ignored(tmp_path: Path) -> None:
    async def go() -> tuple[int, float]:
        stream = LogStream("j", tmp_path / "spool")
        ex = await Execution.start(
            ["trap '' TERM", "sleep 1000 & wait"], job_dir=tmp_path, cwd=tmp_path, env=job_env({}), stream=stream
        )
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await ex.terminate(grace=0.5)
        code = await asyncio.wait_for(ex.wait(), 10)
        assert _group_after_exit(ex.pid) == []
        return code, time.monotonic() - started

    code, took = asyncio.run(go())
    assert code == 128 + 9
    assert 0.5 <= took < 3


def test_background_processes_left_behind_end_with_the_job(tmp_path: Path) -> None:
    async def go() -> tuple[int, list[int]]:
        stream = LogStream("j", tmp_path / "spool")
        ex = await Execution.start(
            ["sleep 1000 &", "echo done"], job_dir=tmp_path, cwd=tmp_path, env=job_env({}), stream=stream
        )
        code = await asyncio.wait_for(ex.wait(), 10)
        return code, _group_after_exit(ex.pid)

    code, left = asyncio.run(go())
    assert (code, left) == (0, [])
    assert os.path.exists(tmp_path / "spool")


# A process that leaves the job's process group and session (setsid), and a
# daemon that double-forks away from its parent: neither may outlive the job.
ESCAPES = [
    "setsid sleep 1234.5 &",
    "( setsid sh -c 'sleep 1234.6 &' & )",
    "sleep 0.3",
]


def _sleepers() -> list[int]:
    """Every live ``sleep 1234.5`` / ``sleep 1234.6`` / ``sleep 1234.7`` (started by these tests only)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        if cmd in (b"sleep\x001234.5\x00", b"sleep\x001234.6\x00", b"sleep\x001234.7\x00") and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _gone(pids: list[int], within: float = 3) -> list[int]:
    deadline = time.monotonic() + within
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def test_processes_that_setsid_or_double_fork_out_of_the_group_end_with_the_job(tmp_path: Path) -> None:
    before = set(_sleepers())

    async def go() -> tuple[int, list[int]]:
        stream = LogStream("j", tmp_path / "spool")
        ex = await Execution.start(ESCAPES, job_dir=tmp_path, cwd=tmp_path, env=job_env({}), stream=stream)
        deadline = time.monotonic() + 5
        while len(set(_sleepers()) - before) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        escaped = sorted(set(_sleepers()) - before)
        code = await asyncio.wait_for(ex.wait(), 10)
        return code, escaped

    code, escaped = asyncio.run(go())
    assert code == 0
    assert len(escaped) == 2  # both left the group: killpg alone would miss them
    assert _gone(escaped) == []


def test_a_stopped_job_leaves_no_setsid_or_daemon_process_behind(tmp_path: Path) -> None:
    before = set(_sleepers())

    async def go() -> list[int]:
        stream = LogStream("j", tmp_path / "spool")
        ex = await Execution.start(
            [*ESCAPES[:2], "sleep 1234.7"], job_dir=tmp_path, cwd=tmp_path, env=job_env({}), stream=stream
        )
        deadline = time.monotonic() + 5
        while len(set(_sleepers()) - before) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        escaped = sorted(set(_sleepers()) - before)
        await ex.terminate(grace=0.5)
        await asyncio.wait_for(ex.wait(), 10)
        return escaped

    escaped = asyncio.run(go())
    assert len(escaped) == 3
    assert _gone(escaped) == []


def test_a_job_killed_with_its_shim_leaves_nothing_behind(tmp_path: Path) -> None:
    # SIGKILL of the whole group kills the shim before it can clean up: the
    # runner's sweep by TRAINYARD_JOB_MARK finds what left the group.
    before = set(_sleepers())

    async def go() -> list[int]:
        stream = LogStream("j", tmp_path / "spool")
        ex = await Execution.start(
            [*ESCAPES[:2], "sleep 1234.7"], job_dir=tmp_path, cwd=tmp_path, env=job_env({}), stream=stream
        )
        deadline = time.monotonic() + 5
        while len(set(_sleepers()) - before) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        escaped = sorted(set(_sleepers()) - before)
        ex.kill()
        await asyncio.wait_for(ex.wait(), 10)
        return escaped

    escaped = asyncio.run(go())
    assert len(escaped) == 3
    assert _gone(escaped) == []


# ------------------------------------------------------------ a standby shim


def _standby_run(tmp_path: Path, commands: list[str], *, kill_first: bool = False) -> tuple[int, int, int, list[str]]:
    """(exit code, the standby's pid, the job's shim pid, its stdout lines)
    of ``commands`` started through a ``ShimStandby`` filled beforehand."""

    async def go() -> tuple[int, int, int]:
        job_dir = tmp_path / "jobs" / "j"
        job_dir.mkdir(parents=True)
        standby = ShimStandby(tmp_path / "jobs")
        await standby.fill()
        waiting = standby._proc
        assert waiting is not None
        if kill_first:
            waiting.kill()
            await waiting.wait()
        stream = LogStream("j", tmp_path / "spool")
        env = job_env({"GREETING": "from the job's own environment"})
        ex = await Execution.start(commands, job_dir=job_dir, cwd=tmp_path, env=env, stream=stream, standby=standby)
        code = await asyncio.wait_for(ex.wait(), 30)
        return code, waiting.pid, ex.pid

    code, standby_pid, shim_pid = asyncio.run(go())
    return code, standby_pid, shim_pid, [t for _, (_, _, t) in read_spool(tmp_path / "spool")]


def test_a_standby_shim_runs_the_job_it_is_handed_as_a_shim_started_for_it(tmp_path: Path) -> None:
    commands = [
        'echo "$GREETING"',
        "pwd",
        "readlink /proc/self/fd/0",
        'echo "$TRAINYARD_JOB_MARK" | cut -d. -f1',
        "exit 4",
    ]

    code, standby_pid, shim_pid, lines = _standby_run(tmp_path, commands)

    assert shim_pid == standby_pid  # the job did not wait for a shim to start
    assert code == 4
    # Its environment and working directory; stdin is /dev/null, not the
    # pipe the job came through; it carries the job's mark.
    assert lines == ["from the job's own environment", str(tmp_path), "/dev/null", "j"]
    assert (tmp_path / "jobs" / "j" / "shim.json").exists()


def test_a_standby_shim_shows_no_runner_token_or_runner_variable_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_RUNNER_TOKEN", "tyr_secret_token")
    monkeypatch.setenv("TRAINYARD_RUNNER_DIR", str(tmp_path))

    async def environ() -> bytes:
        standby = ShimStandby(tmp_path)
        await standby.fill()
        waiting = standby._proc
        assert waiting is not None
        # The exec may still be setting up the new image (its environment is
        # written after the fork returned to us): read until it shows.
        deadline = time.monotonic() + 10
        while not (seen := Path(f"/proc/{waiting.pid}/environ").read_bytes()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        standby.close()
        await waiting.wait()
        return seen

    seen = asyncio.run(environ())
    assert b"tyr_secret_token" not in seen
    assert b"TRAINYARD_RUNNER_DIR" not in seen
    assert b"PATH=" in seen


def test_a_job_gets_a_shim_of_its_own_when_the_standby_died(tmp_path: Path) -> None:
    code, standby_pid, shim_pid, lines = _standby_run(tmp_path, ['echo "$GREETING"'], kill_first=True)

    assert shim_pid != standby_pid
    assert (code, lines) == (0, ["from the job's own environment"])


def test_a_standby_shim_exits_when_it_is_closed_or_its_runner_dies(tmp_path: Path) -> None:
    async def closed() -> int | None:
        standby = ShimStandby(tmp_path)
        await standby.fill()
        waiting = standby._proc
        assert waiting is not None
        standby.close()
        return await asyncio.wait_for(waiting.wait(), 10)

    assert asyncio.run(closed()) == 0
    # A runner that dies (SIGKILL) closes the pipe the same way.
    code = (
        "import asyncio, os, sys; from pathlib import Path; from trainyard_runner.process import ShimStandby\n"
        "async def main():\n"
        f"    s = ShimStandby(Path({str(tmp_path)!r})); await s.fill(); print(s._proc.pid, flush=True)\n"
        "    os.kill(os.getpid(), 9)\n"
        "asyncio.run(main())\n"
    )
    runner = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    standby_pid = int(runner.stdout.split()[0])
    assert _gone([standby_pid], within=10) == []


def test_every_line_is_read_however_long_the_server_takes_to_acknowledge_them(tmp_path: Path) -> None:
    """The job ends with most of its output unread, and nothing is
    acknowledged for 11 s (a busy server): ``wait`` reads it all before it
    returns. (It gave up after 10 s, and the unread lines were lost.)"""

    async def go() -> int:
        stream = LogStream("j", tmp_path / "spool", max_lines=100)
        # ~200 KB: several reads, and the buffer is full after the first.
        lines = ["awk 'BEGIN { for (i = 1; i <= 2000; i++) printf \"%d %0100d\\n\", i, 0 }'"]
        ex = await Execution.start(lines, job_dir=tmp_path, cwd=tmp_path, env=job_env({}), stream=stream)

        async def acks_late() -> None:
            await asyncio.sleep(11)
            while True:
                stream.ack(stream.last_seq)
                await asyncio.sleep(0.05)

        acker = asyncio.create_task(acks_late())
        try:
            return await asyncio.wait_for(ex.wait(), 30)
        finally:
            acker.cancel()

    code = asyncio.run(go())
    assert code == 0
    assert [t for _, (_, _, t) in read_spool(tmp_path / "spool")] == [f"{i} {0:0100d}" for i in range(1, 2001)]

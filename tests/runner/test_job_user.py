"""A root runner runs each job as a user of its own (docs/RUNNER.md, "The
job's user"): real runner processes, real jobs that attack the machine."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.asyncio.server import serve

from tests.runner.test_agent import TOKEN, FakeServer, assign, start_runner, stop
from tests.runner.test_upload_outage import _run
from tests.support.flaky_storage import FlakyStorage

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a job gets a user of its own only under a root runner")


@pytest.fixture
def storage() -> Iterator[FlakyStorage]:
    server = FlakyStorage().start()
    yield server
    server.stop()


def _lines(server: FakeServer, job: str) -> list[str]:
    return [line[2] for line in server.stored.get(job, [])]


def _alive(cmdline: bytes) -> list[int]:
    """Live processes whose command line is exactly ``cmdline`` (NUL-separated)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            live = entry.name.isdigit() and (entry / "cmdline").read_bytes() == cmdline
            if live and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _attempt(what: str, command: str) -> str:
    return f"if {command} 2> /dev/null; then echo 'READ {what}'; else echo 'DENIED {what}'; fi"


def test_a_job_cannot_read_the_runners_token_file_its_environ_or_another_jobs_files(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    victim_dir, snoop_dir = tmp_path / "victim-runner", tmp_path / "snoop-runner"
    victim_dir.mkdir()
    token_file = victim_dir / "runner-token"  # as saved after the bootstrap exchange (the saved token wins)
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)

    async def go() -> FakeServer:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0, max_size=None) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            victim = await start_runner(port, victim_dir)
            snoop = await start_runner(port, snoop_dir)
            try:
                await server.wait_for(lambda: len(server.hellos) == 2, 10)
                await server.to_send.put(
                    assign("victim", ["echo victim-data > mine.txt", "echo started", "sleep 60"], repo)
                )
                await server.wait_for(lambda: "started" in _lines(server, "victim"), 30)
                other = victim_dir / "jobs" / "victim"
                attempts = [
                    _attempt("token file", f"cat {token_file}"),
                    _attempt("runner environ", f"tr '\\0' '\\n' < /proc/{victim.pid}/environ"),
                    _attempt(
                        "own runner environ", "tr '\\0' '\\n' < /proc/$(cat /proc/$PPID/stat | cut -d' ' -f4)/environ"
                    ),
                    _attempt("runner dir listing", f"ls {victim_dir}"),
                    _attempt("other job file", f"cat {other}/work/mine.txt"),
                    _attempt("other job log", f"cat {other}/stdout.log"),
                    _attempt("runner signal", f"kill -0 {victim.pid}"),
                    _attempt("shim signal", "kill -0 $PPID"),
                    'echo "uid=$(id -u)"',
                ]
                await server.to_send.put(assign("snoop", attempts, repo))
                await server.wait_for(lambda: ("succeeded", 0) in server.states("snoop"), 30)
                await server.to_send.put({"type": "cancel_job", "job": "victim", "reason": "done"})
                await server.wait_for(lambda: any(s[0] == "stopped" for s in server.states("victim")), 30)
                return server
            finally:
                await stop(victim)
                await stop(snoop)

    server = asyncio.run(go())
    lines = _lines(server, "snoop")

    assert [line for line in lines if line.startswith(("READ", "DENIED"))] == [
        "DENIED token file",
        "DENIED runner environ",
        "DENIED own runner environ",
        "DENIED runner dir listing",
        "DENIED other job file",
        "DENIED other job log",
        "DENIED runner signal",
        "DENIED shim signal",
    ]
    assert TOKEN not in lines and "victim-data" not in lines
    assert not any("TRAINYARD_RUNNER_TOKEN" in line for line in lines)
    assert lines[-1] != "uid=0"  # the job's own uid, not root
    assert token_file.stat().st_mode & 0o777 == 0o600  # the runner made its token file its own


def test_a_job_that_runs_setsid_env_i_sleep_leaves_nothing_behind(tmp_path: Path, repo: tuple[Path, str]) -> None:
    """``setsid env -i`` leaves the job's process group, its session and its
    environment mark: the job's uid still finds it, whether the job ends by
    itself or is stopped after ignoring SIGTERM (its shim SIGKILLed with the
    group before it can clean up)."""
    ended, stopped = b"sleep\x001000.25\x00", b"sleep\x001000.75\x00"

    async def go() -> tuple[list[int], list[int]]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0, max_size=None) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            runner = await start_runner(port, tmp_path / "rd")
            try:
                await server.wait_for(lambda: server.hellos, 10)
                await server.to_send.put(
                    assign("ends", ["setsid env -i sleep 1000.25 > /dev/null 2>&1 &", "sleep 0.5", "echo done"], repo)
                )
                await server.wait_for(lambda: ("succeeded", 0) in server.states("ends"), 30)
                left_after_end = _alive(ended)
                commands = [
                    "trap '' TERM",
                    "setsid env -i sleep 1000.75 > /dev/null 2>&1 &",
                    "echo escaped",
                    "while :; do sleep 0.1 || true; done",
                ]
                await server.to_send.put(assign("stopped", commands, repo))
                await server.wait_for(lambda: "escaped" in _lines(server, "stopped"), 30)
                deadline = time.monotonic() + 5
                while not _alive(stopped) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert _alive(stopped), "the escaped sleep never started"
                await server.to_send.put({"type": "cancel_job", "job": "stopped", "reason": "user"})
                await server.wait_for(lambda: any(s[0] == "stopped" for s in server.states("stopped")), 30)
                return left_after_end, _alive(stopped)
            finally:
                await stop(runner)

    left_after_end, left_after_stop = asyncio.run(go())

    assert left_after_end == []
    assert left_after_stop == []


def test_what_a_job_left_is_killed_when_the_runners_interpreter_is_out_of_the_job_users_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine's runner may live under a folder its jobs' users cannot pass
    (``/root/...``, a 0700 home): killing what a job left must not need that
    user to start the runner's interpreter."""
    import subprocess
    import sys

    from trainyard_runner import jobuser

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setattr(sys, "executable", str(private / "venv" / "bin" / "python"))
    user = jobuser.claim(tmp_path / "uid-locks")
    left = subprocess.Popen(["sleep", "1000.5"], user=user.uid, group=user.gid, extra_groups=[])
    try:
        assert jobuser.kill_all(user.uid) == 1
        assert left.wait(timeout=10) == -9
        assert jobuser.pids_of(user.uid) == set()
    finally:
        left.kill()
        left.wait()


def test_an_artifact_that_links_to_the_runners_token_is_not_uploaded(
    tmp_path: Path, repo: tuple[Path, str], storage: FlakyStorage
) -> None:
    """The runner (root) reads a job's artifacts as the job's user: a link to
    its token fails the upload instead of sending it."""
    work = tmp_path / "rd"
    work.mkdir()
    (work / "runner-token").write_text(TOKEN + "\n")
    commands = ["mkdir -p model", "echo weights > model/w.bin", f"ln -s {work / 'runner-token'} model/token"]
    job = {**assign("j", commands, repo), "artifacts": [{"path": "./model"}], "api_url": storage.api_url}

    final = _run(work, job)

    assert final["state"] == "failed"
    assert final["reason"].startswith("cannot read token: Permission denied; the job's files are kept on ")
    assert storage.stored == {}


def test_kept_files_are_the_runners_and_their_later_upload_reads_them_as_the_jobs_user(
    tmp_path: Path, repo: tuple[Path, str], storage: FlakyStorage
) -> None:
    """Kept for a later upload, the files stay out of other jobs' reach, the
    record (with the attempt's token) is root's alone, and the retry, storage
    answering, reads them as the job's user too: the link is never sent."""
    work = tmp_path / "rd"
    work.mkdir()
    (work / "runner-token").write_text(TOKEN + "\n")
    commands = ["mkdir -p model", "echo weights > model/w.bin", f"ln -s {work / 'runner-token'} model/token"]
    job = {**assign("j", commands, repo), "artifacts": [{"path": "./model"}], "api_url": storage.api_url}
    assert _run(work, job)["state"] == "failed"
    kept = work / "kept" / "j.1"

    async def a_later_runner() -> None:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            runner = await start_runner(port, work, "--kept-retry-seconds", "1", api_url=storage.api_url)
            try:
                await asyncio.sleep(4)  # its start and a few retries, storage answering
            finally:
                await stop(runner)

    asyncio.run(a_later_runner())

    assert storage.stored == {}
    assert storage.kept_reports == []
    assert (kept / "work" / "model" / "token").is_symlink()
    info = (kept / "kept.json").stat()
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o600)
    folder = kept.stat()
    assert (folder.st_uid, folder.st_mode & 0o777) == (0, 0o710)
    assert folder.st_gid == (kept / "work").stat().st_uid != 0  # the job's own group only

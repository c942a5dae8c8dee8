"""The browser's terminal into a running job, the runner's end
(runner/trainyard_runner/sessions/terminal.py): a shell on a terminal as the
job's user, raw bytes on the socket the relay hands over."""

from __future__ import annotations

import asyncio
import os
import re
import socket
from pathlib import Path

from trainyard_runner.sessions.terminal import serve_terminal

from tests.runner.test_sessions_ssh import running_job


async def _read_until(reader: asyncio.StreamReader, needle: bytes, timeout: float = 15) -> bytes:
    seen = b""
    async with asyncio.timeout(timeout):
        while needle not in seen:
            chunk = await reader.read(65536)
            assert chunk, f"the terminal closed before {needle!r}: {seen!r}"
            seen += chunk
    return seen


def test_typed_commands_run_in_the_job_and_a_resize_shows_in_stty_size(tmp_path: Path, repo: tuple[Path, str]) -> None:
    async def go() -> tuple[bytes, bytes, bytes, bytes]:
        async with running_job(tmp_path, repo) as job:
            ours, theirs = socket.socketpair()
            resizes: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
            served = asyncio.create_task(serve_terminal(theirs, job.session_context(), resizes))
            reader, writer = await asyncio.open_connection(sock=ours)
            writer.write(b"echo $TRAINYARD_RUN-$((6*7)); pwd; id -u\n")
            first = await _read_until(reader, b"r1-42")
            await _read_until(reader, b"/work")
            resizes.put_nowait((132, 43))
            await asyncio.sleep(0.2)
            writer.write(b"stty size\n")
            size = await _read_until(reader, b"43 132")
            writer.write("echo ünïcødé\n".encode())
            text = await _read_until(reader, "ünïcødé\r\n".encode())
            writer.write(b"exit 3\n")
            rest = await reader.read()  # the shell exited: the runner closed the socket
            await asyncio.wait_for(served, 10)
            writer.close()
            return first, size, text, rest

    first, size, text, rest = asyncio.run(go())

    assert b"r1-42\r\n" in first
    assert b"43 132\r\n" in size
    assert "ünïcødé\r\n".encode() in text
    assert b"exit" in rest or rest == b""


def test_a_closed_socket_hangs_up_the_shell(tmp_path: Path, repo: tuple[Path, str]) -> None:
    async def go() -> int:
        async with running_job(tmp_path, repo) as job:
            ours, theirs = socket.socketpair()
            served = asyncio.create_task(serve_terminal(theirs, job.session_context(), asyncio.Queue()))
            reader, writer = await asyncio.open_connection(sock=ours)
            writer.write(b"echo shell=$$=\n")
            seen = b""
            while (found := re.search(rb"shell=(\d+)=", seen)) is None:
                seen += await _read_until(reader, b"=")
            pid = int(found[1])
            writer.close()
            await asyncio.wait_for(served, 10)
            for _ in range(100):
                if not os.path.exists(f"/proc/{pid}"):
                    break
                await asyncio.sleep(0.05)
            return pid

    pid = asyncio.run(go())

    assert not os.path.exists(f"/proc/{pid}")


def test_the_prompt_names_the_jobs_user_even_without_a_user_database_entry(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    async def go() -> bytes:
        async with running_job(tmp_path, repo) as job:
            ours, theirs = socket.socketpair()
            served = asyncio.create_task(serve_terminal(theirs, job.session_context(), asyncio.Queue()))
            reader, writer = await asyncio.open_connection(sock=ours)
            writer.write(b"echo prompt-$((40+2))\n")  # its output, not the typed line's echo, says prompt-42
            seen = b""
            async with asyncio.timeout(15):
                while b"$ " not in seen.partition(b"prompt-42\r\n")[2]:  # the prompt after the output
                    chunk = await reader.read(65536)
                    assert chunk, f"the terminal closed: {seen!r}"
                    seen += chunk
            writer.write(b"exit\n")
            await reader.read()
            await asyncio.wait_for(served, 10)
            writer.close()
            return seen

    seen = asyncio.run(go())

    assert b"I have no name!" not in seen
    if os.geteuid() == 0:  # a root runner: the job's own uid, which no /etc/passwd entry names
        assert b"job@" in seen.split(b"prompt-42\r\n")[-1]

"""Running a job's commands: one ``bash`` under ``_reaper.py`` in its own process group, stdout and
stderr read in chunks and split into lines for the job's ``LogStream``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from .logstream import LogStream
from .protocol import MAX_LINE_BYTES

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
# Leads the job's process group and takes it down if the runner dies.
REAPER = Path(__file__).with_name("_reaper.py")
TOKEN_VARS = ("TRAINYARD_RUNNER_TOKEN", "TRAINYARD_RUNNER_TOKEN_FILE")


def runner_env() -> dict[str, str]:
    """Our environment without the runner token."""
    return {k: v for k, v in os.environ.items() if k not in TOKEN_VARS}


def job_env(job_env: Mapping[str, str], *, pip_cache_dir: Path | None = None) -> dict[str, str]:
    """The job's environment: ours without the runner token, plus the job's.
    ``PIP_CACHE_DIR`` (shared by the runner's jobs) unless the job sets it."""
    env = runner_env()
    if pip_cache_dir is not None and "PIP_CACHE_DIR" not in job_env:
        env["PIP_CACHE_DIR"] = str(pip_cache_dir)
    env.update(job_env)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def script(commands: list[str]) -> str:
    """One bash script; ``set -e`` ends it at the first failing command with
    that command's exit code."""
    return "set -e\n" + "\n".join(commands) + "\n"


class Execution:
    """One running job process. ``start`` then ``wait``; ``terminate`` from
    anywhere to stop the whole process group."""

    def __init__(self, proc: asyncio.subprocess.Process, stream: LogStream) -> None:
        self.proc = proc
        self.pid = proc.pid  # also the process group id (start_new_session)
        self._stream = stream
        self._readers = [
            asyncio.create_task(_pump(proc.stdout, "o", stream)),  # type: ignore[arg-type]
            asyncio.create_task(_pump(proc.stderr, "e", stream)),  # type: ignore[arg-type]
        ]
        self.terminated = False

    @classmethod
    async def start(
        cls,
        commands: list[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        stream: LogStream,
        argv: list[str] | None = None,
    ) -> Execution:
        """Start ``bash -c SCRIPT`` (or ``argv``, e.g. ``docker run …``) under the reaper."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            str(REAPER),
            *(argv or ["bash", "-c", script(commands)]),
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        return cls(proc, stream)

    async def wait(self) -> int:
        """Wait for bash to exit, kill what it left behind in its process group,
        read the pipes to the end and close the stream. Returns the exit code,
        128 + signal number when bash was killed by a signal (shell convention)."""
        code = await self._exited()
        # Background children would keep the pipes open forever and outlive
        # the job; they belong to the job, so they end with it.
        self._killpg(signal.SIGKILL)
        _, pending = await asyncio.wait(self._readers, timeout=10)
        for task in pending:
            task.cancel()
        self._stream.close()
        return 128 - code if code < 0 else code

    async def _exited(self) -> int:
        # On Python 3.11 Process.wait() also waits for the pipes to close,
        # which a background child can keep open forever; returncode is set
        # as soon as bash itself is reaped, so poll it too.
        waiter = asyncio.ensure_future(self.proc.wait())
        while self.proc.returncode is None:
            await asyncio.wait({waiter}, timeout=0.05)
        waiter.cancel()
        return self.proc.returncode

    async def terminate(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
        self.terminated = True
        self._killpg(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), grace)
        except TimeoutError:
            log.info("job process ignored SIGTERM for %.0fs, killing", grace)
        self._killpg(signal.SIGKILL)

    def _killpg(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


async def _pump(reader: asyncio.StreamReader, stream_name: str, stream: LogStream) -> None:
    """Read ``reader`` to EOF, handing complete lines to ``stream``.

    Reads in chunks and splits them, which is several times faster than
    ``readline`` per line; a line longer than MAX_LINE_BYTES is cut into pieces
    (protocol.py says how long a piece is, and the server relies on it).
    """
    rest = b""
    while True:
        chunk = await reader.read(_CHUNK)
        if not chunk:
            break
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        texts: list[str] = []
        if cut:
            texts = data[: cut - 1].decode("utf-8", errors="replace").split("\n")
        rest = data[cut:]
        # ">": the byte after the cut tells whether it splits a character.
        while len(rest) > MAX_LINE_BYTES:
            at = _boundary(rest)
            texts.append(rest[:at].decode("utf-8", errors="replace"))
            rest = rest[at:]
        texts = _split_long(texts)
        await stream.put(stream_name, texts)
    if rest:
        await stream.put(stream_name, [rest.decode("utf-8", errors="replace")])


def _boundary(data: bytes) -> int:
    """Where to cut ``data`` (longer than MAX_LINE_BYTES): at MAX_LINE_BYTES, or
    up to 3 bytes before it so no UTF-8 character is split in two (a split one
    would arrive as two U+FFFD, hiding what it was on both sides). Bytes that
    are not UTF-8 are cut at MAX_LINE_BYTES."""
    for back in range(4):
        if data[MAX_LINE_BYTES - back] & 0xC0 != 0x80:  # not a continuation byte
            return MAX_LINE_BYTES - back
    return MAX_LINE_BYTES


def _split_long(texts: list[str]) -> list[str]:
    # Only lines that arrived whole in one chunk can be long here; rare, so
    # check cheaply first. Measured in characters, close enough to bytes.
    if all(len(t) <= MAX_LINE_BYTES for t in texts):
        return texts
    out: list[str] = []
    for t in texts:
        out.extend(t[i : i + MAX_LINE_BYTES] for i in range(0, max(len(t), 1), MAX_LINE_BYTES))
    return out

"""Running a job's commands: one ``bash`` under ``_shim.py``, the leader of its own process group
and session, which appends the job's stdout and stderr to files in the job's directory; the runner
follows those files from byte offsets, splits them into lines for the job's ``LogStream``, and learns the
exit code from the shim's exit file. A runner started later on the same work dir re-attaches to a shim
that is still alive (``Execution.attach``).

Nothing of a job outlives it (docs/RUNNER.md, "Containment"): the shim is the subreaper of the job's
processes (and puts them in a cgroup v2 of their own where one is writable); every process of the job
carries ``TRAINYARD_JOB_MARK=<mark>`` in its environment, and once the job has ended or was killed the
runner ``sweep``s ``/proc`` for it: a process that left the group (``setsid``, a double fork) is found
even when the shim itself was SIGKILLed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import jobuser
from .jobuser import JobUser
from .logstream import LogStream
from .protocol import MAX_LINE_BYTES

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
POLL_SECONDS = 0.05  # how often the output files and the exit file are looked at when nothing happens
# After output, an output file is looked at again this soon, then twice as
# late each time nothing came, up to POLL_SECONDS. Until its first output,
# for up to FAST_POLL_SECONDS after following starts, it is looked at every
# FIRST_POLL_SECONDS: the first line of a job is read within milliseconds of
# being written, however long the job takes to print it.
FIRST_POLL_SECONDS = 0.002
FAST_POLL_SECONDS = 1.0
# Leads the job's process group; see its docstring for the files it writes.
SHIM = Path(__file__).with_name("_shim.py")
OUTPUT_FILES = {"o": "stdout.log", "e": "stderr.log"}
SHIM_FILE, EXIT_FILE, SHIM_LOG = "shim.json", "exit.json", "shim.log"
TOKEN_VARS = ("TRAINYARD_RUNNER_TOKEN", "TRAINYARD_RUNNER_TOKEN_FILE")
MARK_VAR = "TRAINYARD_JOB_MARK"  # the same name in _shim.py
UID_VAR = "TRAINYARD_JOB_UID"  # the same name in _shim.py
SWEEP_ROUNDS = 20  # a job forking while it is swept: sweep again, this many times at most


# Given every batch of a job's output lines as they are read (its metrics' patterns).
Tap = Callable[[list[str]], None]

_SHIM_ARGV = (sys.executable, "-I", "-S", str(SHIM))
# A standby's own environment (what /proc shows for it, also once it is a
# job's shim): the path and the locale, never the runner's token or its
# variables (TRAINYARD_RUNNER_DIR counts a process as the runner's).
_STANDBY_VARS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE")


class ShimStandby:
    """A shim started ahead of the next job (``_shim.py JOBS_DIR/ standby``),
    waiting for it on stdin: the job's start does not wait for Python to
    start (measured in bench/results/2026-12-04-warm-start.md).
    The runner fills it when idle; ``Execution.start`` hands it the job, or
    starts a shim of its own when none waits. ``close`` ends the input, and
    with it the waiting shim, as the runner's own death does."""

    def __init__(self, jobs_dir: Path) -> None:
        self._jobs_dir = jobs_dir
        self._proc: asyncio.subprocess.Process | None = None

    async def fill(self) -> None:
        """Start one unless one waits; a failure to start is logged (jobs start their own)."""
        if self._proc is not None and self._proc.returncode is None:
            return
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *_SHIM_ARGV,
                f"{self._jobs_dir}/",
                "standby",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                env={k: v for k, v in os.environ.items() if k in _STANDBY_VARS},
            )
        except OSError as e:
            log.warning("could not start a standby shim: %s", e)

    async def hand(self, job: Mapping[str, object]) -> asyncio.subprocess.Process | None:
        """Give ``job`` to the waiting shim; None when none waits (or it died)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.stdin is None or proc.returncode is not None:
            return None
        try:
            proc.stdin.write(json.dumps(job).encode())
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):  # it died: the job gets a shim of its own
            return None
        return proc

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()


class ShimLost(Exception):
    """The shim ended without writing its exit file, and nobody here killed it."""


@dataclass(frozen=True)
class ShimRecord:
    """Who the shim of a job is (``shim.json``): pid, start time in clock ticks
    since boot, boot id. A pid alone could have been reused."""

    pid: int
    start: int
    boot: str
    mark: str = ""  # TRAINYARD_JOB_MARK of the job's processes ("" for a shim of an older runner)
    cgroup: str = ""  # the job's cgroup v2, "" for none
    uid: int = 0  # the job's own uid (jobuser.py), 0 when it runs as the runner's user

    @classmethod
    def load(cls, job_dir: Path) -> ShimRecord | None:
        try:
            raw = json.loads((job_dir / SHIM_FILE).read_text())
            return cls(
                pid=int(raw["pid"]),
                start=int(raw["start"]),
                boot=str(raw["boot"]),
                mark=str(raw.get("mark") or ""),
                cgroup=str(raw.get("cgroup") or ""),
                uid=int(raw.get("uid") or 0),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def alive(self) -> bool:
        """The very process that wrote the record still runs (not a zombie)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except (OSError, IndexError):
            return False
        return fields[0] not in ("Z", "X") and int(fields[19]) == self.start and boot == self.boot


def read_exit(job_dir: Path) -> int | None:
    """The exit code the shim recorded, or None when it wrote none (yet)."""
    try:
        return int(json.loads((job_dir / EXIT_FILE).read_text())["code"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def sweep(mark: str, cgroup: str = "") -> int:
    """SIGKILL every process carrying ``TRAINYARD_JOB_MARK=mark`` (and every
    process of ``cgroup``) until none is left; returns how many were killed."""
    if not mark:
        return 0
    needle = f"{MARK_VAR}={mark}\0".encode()
    killed = 0
    for _ in range(SWEEP_ROUNDS):
        doomed = _marked(needle) | _cgroup_pids(cgroup)
        doomed.discard(os.getpid())
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed += len(doomed)
        if not doomed:
            break
    if killed:
        log.info("killed %d process(es) left behind by the job (mark %s)", killed, mark)
    return killed


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
    """One job process under its shim. ``start`` (or ``attach`` after a
    runner restart) then ``wait``; ``terminate`` from anywhere to stop the
    whole process group."""

    def __init__(
        self,
        job_dir: Path,
        stream: LogStream,
        pid: int,
        *,
        proc: asyncio.subprocess.Process | None = None,
        record: ShimRecord | None = None,
        offsets: Mapping[str, int] | None = None,
        user: JobUser | None = None,
        tap: Tap | None = None,
    ) -> None:
        self.job_dir = job_dir
        self.pid = pid  # the shim's: also the process group id
        self._proc = proc  # ours: reaped by asyncio; None when attached to another runner's shim
        self._record = record
        self.mark = record.mark if record is not None else ""
        self.cgroup = record.cgroup if record is not None else ""
        self.user = user  # the job's uid, held by this runner: every process of it is killed at the end
        self._stream = stream
        self.terminated = False
        self._killed = False  # we SIGKILLed the group: a missing exit file means 128 + 9
        self._ended = asyncio.Event()
        self._result = asyncio.ensure_future(self._exited())
        offsets = offsets or {}
        self._readers = [
            asyncio.ensure_future(
                _follow(job_dir / OUTPUT_FILES[name], name, stream, offsets.get(name, 0), self._ended, tap)
            )
            for name in OUTPUT_FILES
        ]

    @classmethod
    async def start(
        cls,
        commands: list[str],
        *,
        job_dir: Path,
        cwd: Path,
        env: Mapping[str, str],
        stream: LogStream,
        argv: list[str] | None = None,
        outlive: bool = False,
        standby: ShimStandby | None = None,
        user: JobUser | None = None,
        tap: Tap | None = None,
    ) -> Execution:
        """Start ``bash -c SCRIPT`` (or ``argv``, e.g. ``docker run …``) under
        the shim: ``standby``'s waiting one if it has one, else a new one.
        ``outlive``: the job keeps running if the runner dies. ``user``: the
        commands run as that uid (the shim stays the runner's user).
        ``tap``: also given every batch of the job's output lines."""
        for name in (SHIM_FILE, EXIT_FILE, *OUTPUT_FILES.values()):
            (job_dir / name).unlink(missing_ok=True)
        for name in OUTPUT_FILES.values():
            (job_dir / name).touch(mode=0o600)
        mark = f"{job_dir.name}.{secrets.token_hex(6)}"
        argv = argv or ["bash", "-c", script(commands)]
        env = {**env, MARK_VAR: mark}
        if user is not None:
            env[UID_VAR] = str(user.uid)
        job = {"job_dir": str(job_dir), "outlive": outlive, "argv": argv, "cwd": str(cwd), "env": env}
        proc = await standby.hand(job) if standby is not None else None
        if proc is None:
            with open(job_dir / SHIM_LOG, "ab") as shim_log:
                proc = await asyncio.create_subprocess_exec(
                    *_SHIM_ARGV,
                    str(job_dir),
                    "1" if outlive else "0",
                    *argv,
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=shim_log,
                    start_new_session=True,
                )
        execution = cls(job_dir, stream, proc.pid, proc=proc, user=user, tap=tap)
        execution.mark = mark
        return execution

    @classmethod
    def attach(
        cls,
        job_dir: Path,
        record: ShimRecord,
        stream: LogStream,
        offsets: Mapping[str, int],
        user: JobUser | None = None,
        tap: Tap | None = None,
    ) -> Execution:
        """Follow a shim started by an earlier runner process, its output from ``offsets``."""
        return cls(job_dir, stream, record.pid, record=record, offsets=offsets, user=user, tap=tap)

    @property
    def over(self) -> bool:
        """The job's commands ended (or their shim is gone); not when this
        runner stopped following them (a job left running for the next one)."""
        return self._result.done() and not self._result.cancelled()

    async def wait(self) -> int:
        """Wait for the job to end, read its output to the end and close the
        stream. Returns the exit code, 128 + signal number when the job was
        killed by a signal (shell convention). Raises ``ShimLost`` when the
        shim vanished without an exit code."""
        try:
            code = await asyncio.shield(self._result)
        except ShimLost:
            await self._read_to_the_end()
            raise
        await self._read_to_the_end()
        return code

    async def _read_to_the_end(self) -> None:
        """No time limit: a reader behind a busy server (``put`` waits for its
        acks) still has lines nobody else will read. Each reader stops at the
        size its file had at the end."""
        self._ended.set()
        done, _ = await asyncio.wait(self._readers)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("reading the output of %s failed", self.job_dir, exc_info=task.exception())
        self._stream.close()

    async def terminate(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
        self.terminated = True
        killpg(self.pid, signal.SIGTERM)
        _, pending = await asyncio.wait({self._result}, timeout=grace)
        if pending:
            log.info("job process ignored SIGTERM for %.0fs, killing", grace)
        self.kill()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (the shim ignores SIGTERM)."""
        killpg(self.pid, sig)

    async def ended_within(self, seconds: float) -> bool:
        """Whether the job ends within ``seconds`` (at once if it already has)."""
        done, _ = await asyncio.wait({self._result}, timeout=max(seconds, 0.0))
        return bool(done)

    def kill(self) -> None:
        """SIGKILL the whole process group now, and whatever left it."""
        self._killed = True
        killpg(self.pid, signal.SIGKILL)
        self._sweep()

    def _sweep(self) -> None:
        # The cgroup is known only once the shim wrote shim.json.
        record = self._record or ShimRecord.load(self.job_dir)
        sweep(self.mark, record.cgroup if record is not None else self.cgroup)
        if self.user is not None and self.user.lock_fd is not None:
            jobuser.kill_all(self.user.uid)

    def _shim_alive(self) -> bool:
        if self._proc is not None:
            return self._proc.returncode is None
        assert self._record is not None
        return self._record.alive()

    async def _exited(self) -> int:
        reaper = asyncio.ensure_future(self._proc.wait()) if self._proc is not None else None
        try:
            while (code := read_exit(self.job_dir)) is None and self._shim_alive():
                if reaper is not None:
                    await asyncio.wait({reaper}, timeout=POLL_SECONDS)
                else:
                    await asyncio.sleep(POLL_SECONDS)
        finally:
            if reaper is not None and not reaper.done():
                reaper.cancel()
        # Ended (not cancelled: a runner leaving a job that outlives it must not
        # sweep): the shim killed the job's processes; this finds any it could not.
        self._sweep()
        if code is not None:
            return code
        code = read_exit(self.job_dir)  # written just before it ended
        if code is not None:
            return code
        # Killed before it could write the file: whatever is left of the job goes too.
        killpg(self.pid, signal.SIGKILL)
        if self._proc is not None and self._proc.returncode is not None:
            returncode = self._proc.returncode
            return 128 - returncode if returncode < 0 else returncode
        if self._killed:
            return 128 + signal.SIGKILL
        raise ShimLost("the job's supervisor process ended without recording an exit code (was it killed?)")


def _marked(needle: bytes) -> set[int]:
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in f.read():
                    found.add(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def _cgroup_pids(cgroup: str) -> set[int]:
    if not cgroup:
        return set()
    try:
        return {int(line) for line in Path(cgroup, "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


async def _follow(
    path: Path, stream_name: str, stream: LogStream, offset: int, ended: asyncio.Event, tap: Tap | None = None
) -> None:
    """Read ``path`` from byte ``offset`` as it grows, handing complete lines
    to ``stream`` with the offset after them (the spool keeps it, so a later
    runner resumes there), until ``ended`` is set and the file is read to its
    size at that moment (a process that escaped the job and writes on cannot
    keep it reading). However long that takes: ``stream.put`` waits while the
    server is behind, and no line the job printed is left unread.

    Reads in chunks and splits them, which is several times faster than
    ``readline`` per line; a line longer than MAX_LINE_BYTES is cut into pieces
    (protocol.py says how long a piece is, and the server relies on it).
    """
    rest = b""
    start = offset  # the file offset of rest's first byte
    wait = FIRST_POLL_SECONDS
    fast_until = time.monotonic() + FAST_POLL_SECONDS  # until the first output
    end: int | None = None  # the file's size when the job had ended
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            if end is None and ended.is_set():  # looked at before reading: what follows sees everything
                end = os.fstat(f.fileno()).st_size
            chunk = f.read(_CHUNK if end is None else max(0, min(_CHUNK, end - f.tell())))
            if not chunk:
                if end is not None:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended.wait(), wait)
                if time.monotonic() > fast_until:
                    wait = min(wait * 2, POLL_SECONDS)
                continue
            wait = FIRST_POLL_SECONDS
            fast_until = 0.0
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
            if texts:
                start += len(data) - len(rest)
                if tap is not None:
                    tap(texts)
                await stream.put(stream_name, texts, offset=start)
    if rest:
        texts = [rest.decode("utf-8", errors="replace")]
        if tap is not None:
            tap(texts)
        await stream.put(stream_name, texts, offset=start + len(rest))


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
    if max(map(len, texts), default=0) <= MAX_LINE_BYTES:
        return texts
    out: list[str] = []
    for t in texts:
        out.extend(t[i : i + MAX_LINE_BYTES] for i in range(0, max(len(t), 1), MAX_LINE_BYTES))
    return out

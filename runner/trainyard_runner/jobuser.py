"""The user a job runs as (docs/RUNNER.md "The job's user"; decision 0092).

A runner started as root runs each bash job under a uid of its own, taken
from a reserved range (``TRAINYARD_RUNNER_JOB_UIDS``, default
``JOB_UIDS``) with no passwd entry: its group is the same number, it has no
supplementary groups and ``no_new_privs`` (a setuid program gains nothing).
The job cannot read what is root's and private: the runner's token and
``runner.json`` (0600), the runner's work dir listing, another job's
directory (``jobs/<job>/`` is root's, mode 0710, group the job's gid), the
server's or runner's ``/proc/<pid>/environ``; it cannot signal the runner
or its shim. Its working tree and home are its own.

A uid is one job's at a time on the machine: it is taken with an ``flock``
on ``LOCK_DIR/<uid>`` (held by the runner from before the job starts until
every process of the uid is gone) and never while a process of it lives (a
job whose runner died keeps running). At the job's end every process of the
uid is killed (``kill_all``), which catches what left the process group,
the session and the job's environment mark (``setsid env -i sleep 1000 &``).

A runner that is not root cannot change users: its jobs run as its own
user, as the runner itself, and can read what it can (its token included).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import random
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

log = logging.getLogger(__name__)

JOB_UIDS = range(2_000_000_000, 2_000_065_536)
JOB_UIDS_VAR = "TRAINYARD_RUNNER_JOB_UIDS"  # "FIRST-LAST", inclusive
LOCK_DIR = Path("/run/trainyard-runner/job-uids")
JOB_NAME = "trainyard-job"  # USER and LOGNAME of a job (there is no passwd entry to look up)
KILL_ROUNDS = 20
_P = ParamSpec("_P")
_T = TypeVar("_T")


class NoJobUser(Exception):
    """Every uid of the range is taken (or the lock folder cannot be written)."""


def isolating() -> bool:
    """Jobs get a user of their own: the runner runs as root."""
    return os.geteuid() == 0


@dataclass
class JobUser:
    """One job's uid (and gid, the same number), claimed by this runner process."""

    uid: int
    lock_fd: int | None = None

    @property
    def gid(self) -> int:
        return self.uid

    def release(self) -> None:
        """Kill what is left of the uid, then let another job take it."""
        fd, self.lock_fd = self.lock_fd, None
        if fd is None:
            return
        kill_all(self.uid)
        os.close(fd)

    def unlock(self) -> None:
        """Free the uid's lock and leave its processes running (a job that outlives this runner)."""
        fd, self.lock_fd = self.lock_fd, None
        if fd is not None:
            os.close(fd)

    def give(self, path: Path) -> None:
        """``path`` and everything under it become the job's (symlinks are not followed)."""
        give(path, self.uid, self.gid)

    def reading(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Call ``fn`` with this thread's file access checked as the job's
        user (``setfsuid``, per thread): an output the runner reads for the
        job (an artifact, a cache) cannot be a link to what only root may
        read. Call it in a worker thread (``asyncio.to_thread``)."""
        with _fs_identity(self.uid, self.gid):
            return fn(*args, **kwargs)


def claim(lock_dir: Path = LOCK_DIR, uids: range | None = None) -> JobUser:
    """A uid of the range that no job holds and no process runs as, locked for this job."""
    uids = uids or configured_uids()
    lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    busy = running_uids()
    start = random.randrange(len(uids))  # runners starting together rarely try the same one
    for i in range(len(uids)):
        uid = uids[(start + i) % len(uids)]
        if uid in busy:
            continue
        user = take(uid, lock_dir)
        if user is not None:
            if uid in running_uids():  # a process of it started meanwhile (a job whose runner died)
                os.close(user.lock_fd or -1)
                continue
            return user
    raise NoJobUser(f"every job uid from {uids.start} to {uids.stop - 1} is in use on this machine")


def take(uid: int, lock_dir: Path = LOCK_DIR) -> JobUser | None:
    """Lock ``uid`` for this process; None when another job holds it."""
    lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return JobUser(uid, fd)


def configured_uids() -> range:
    """``TRAINYARD_RUNNER_JOB_UIDS`` ("FIRST-LAST"), else ``JOB_UIDS``."""
    raw = os.environ.get(JOB_UIDS_VAR, "").strip()
    if not raw:
        return JOB_UIDS
    first, _, last = raw.partition("-")
    try:
        uids = range(int(first), int(last) + 1)
    except ValueError:
        raise ValueError(f"{JOB_UIDS_VAR} must be FIRST-LAST (two numbers), not {raw!r}") from None
    if not uids or uids.start < 1000:
        raise ValueError(f"{JOB_UIDS_VAR} must be a non-empty range of uids from 1000 up, not {raw!r}")
    return uids


def running_uids() -> set[int]:
    """Every uid a process runs as (real, effective, saved or filesystem)."""
    found: set[int] = set()
    for pid in _pids():
        found |= _uids_of(pid)
    return found


def pids_of(uid: int) -> set[int]:
    return {pid for pid in _pids() if uid in _uids_of(pid)}


def kill_all(uid: int) -> int:
    """SIGKILL every process of ``uid`` until none is left; returns how many
    there were. ``kill(-1)`` from a process of the uid reaches all of them at
    once, so a job that forks while it is killed does not get away. That
    process is a fork that becomes the uid, not a program it would have to
    reach: the runner's own interpreter may sit where the uid cannot pass."""
    doomed = pids_of(uid)
    count = len(doomed)
    for _ in range(KILL_ROUNDS):
        if not doomed:
            break
        _kill_as(uid)
        for pid in doomed:  # not the uid's any more by now, or a zombie nobody reaps
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        doomed = {pid for pid in pids_of(uid) if not _zombie(pid)}
    if count:
        log.info("killed %d process(es) of job uid %d", count, uid)
    return count


def _kill_as(uid: int) -> None:
    """``kill(-1, SIGKILL)`` as ``uid`` (its gid, no other group) from a
    forked child that does nothing else before it exits."""
    child = os.fork()
    if child == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def give(path: Path, uid: int, gid: int) -> None:
    """``lchown`` ``path`` and everything under it (no link is followed)."""
    os.lchown(path, uid, gid)
    if not path.is_dir() or path.is_symlink():
        return
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            os.lchown(os.path.join(dirpath, name), uid, gid)


def take_back(path: Path) -> None:
    """``path`` and everything under it become root's, writable by root only."""
    for dirpath, dirnames, filenames in os.walk(path):
        os.lchown(dirpath, 0, 0)
        os.chmod(dirpath, os.stat(dirpath).st_mode & ~0o022)
        for name in (*dirnames, *filenames):
            full = os.path.join(dirpath, name)
            os.lchown(full, 0, 0)
            if not os.path.islink(full):
                os.chmod(full, os.stat(full).st_mode & ~0o022)


def make_reachable(path: Path) -> list[Path]:
    """Let other users pass through ``path`` and its parents (``o+x``, never
    ``o+r``), so that a job reaches its directory under the runner's work
    dir; returns the folders that were changed."""
    changed = []
    for folder in (path, *path.parents):
        mode = folder.stat().st_mode
        if not mode & 0o001:
            os.chmod(folder, mode | 0o001)
            changed.append(folder)
    return changed


def _pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def _uids_of(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return {int(v) for v in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def _fs_identity(uid: int, gid: int) -> Iterator[None]:
    # setfsuid/setfsgid change the calling thread only (glibc does not
    # broadcast them to the other threads as it does setuid).
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    try:
        yield
    finally:
        _libc.setfsuid(0)
        _libc.setfsgid(0)


def prepare_work_dir(work_dir: Path, *, private: list[Path], shared: list[Path]) -> None:
    """Before the first job of a root runner: files are created readable by
    default (umask 022: the git cache and the environments are read by the
    jobs' users); ``work_dir`` and ``jobs/`` may be passed through, not
    listed (0711); ``private`` files and folders are root's alone (the
    token, ``runner.json``, kept files); ``shared`` folders are readable."""
    os.umask(0o022)
    for folder in (work_dir, work_dir / "jobs"):
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o711)
    for path in private:
        if path.exists():
            os.chmod(path, 0o700 if path.is_dir() else 0o600)
    for folder in shared:
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
        for changed in make_reachable(folder):
            log.warning("made %s searchable by other users (o+x): jobs run as users of their own", changed)
    for changed in make_reachable(work_dir):
        log.warning("made %s searchable by other users (o+x): jobs run as users of their own", changed)

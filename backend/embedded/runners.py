"""Clean-up of ``trainyard-runner`` processes started by the ``local`` backend.

The local backend starts each runner detached in its own session and keeps
its files in ``$TRAINYARD_DATA_DIR/local-runners/`` (its ``runners_dir``;
``backend/clouds/backends/local/process.py``): ``<key>.pid``, the record
``<key>.json``, ``<key>.log`` and the work directory ``<key>/``, where the
key is the Instance's idempotency key. Runners outlive the Celery worker
that started them, so whoever owns the data dir (the supervisor, the e2e
stack) kills them on shutdown and after a crash.

Only the pidfiles are deleted: the records stay, so the backend's
``describe`` reports those machines TERMINATED (not unknown) to the
reconciler after a restart, and its ``terminate`` deletes them.
"""

from __future__ import annotations

import os
from pathlib import Path

from backend.clouds.backends.local.process import kill_shims, names_runner
from backend.embedded.processes import cmdline, groups_stop, pid_alive, pid_stop

STOP_TIMEOUT_SECONDS = 5.0


def local_runners_kill(data_dir: Path) -> list[int]:
    """Kill every runner that has a pidfile under ``data_dir``; delete the pidfiles.

    1. Read each pidfile; skip pids that are dead or whose command line does
       not name the runner (the pid was reused by something else).
    2. SIGTERM each runner's process group (a lone process if the runner is
       not a group leader, so we never hit a group it merely joined), SIGKILL
       what is left after 5 s.
    3. Delete all pidfiles, including unreadable and stale ones.
    4. SIGKILL the process group of every job shim left under a runner's
       work directory.

    Returns the pids that were signalled.
    """
    pidfiles = sorted((data_dir / "local-runners").glob("*.pid"))
    pids = [pid for pid in map(_read_pid, pidfiles) if pid and _is_runner(pid)]
    leaders = [pid for pid in pids if _pgid(pid) == pid]
    groups_stop(leaders, timeout=STOP_TIMEOUT_SECONDS)
    for pid in set(pids) - set(leaders):
        pid_stop(pid, timeout=STOP_TIMEOUT_SECONDS)
    for pidfile in pidfiles:
        pidfile.unlink(missing_ok=True)
    # Their jobs' shims: they die with a local runner (no --jobs-outlive-runner),
    # but a runner that was SIGKILLed before its shim set PDEATHSIG, or one
    # started by another configuration, may have left some.
    for work_dir in (p for p in (data_dir / "local-runners").glob("*") if p.is_dir()):
        kill_shims(work_dir)
    return pids


def _read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _is_runner(pid: int) -> bool:
    return pid_alive(pid) and names_runner(cmdline(pid).encode())


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return pid

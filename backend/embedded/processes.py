"""Small helpers to inspect and stop processes and process groups (Linux)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil

POLL_SECONDS = 0.1


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live process (a zombie counts as dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def cmdline(pid: int) -> str:
    """The process's command line joined by spaces, or "" if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def group_members(pgid: int) -> list[int]:
    """Live pids whose process group is ``pgid``."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and pid_alive(proc.pid):
                members.append(proc.pid)
        except OSError:
            continue
    return members


def groups_stop(pgids: list[int], *, timeout: float) -> None:
    """SIGTERM every group in ``pgids``, SIGKILL what is left after ``timeout``.

    Never signals the caller's own group. Groups are signalled all at once so
    the total wait is ``timeout``, not ``timeout`` per group.
    """
    own = os.getpgrp()
    pgids = [pgid for pgid in pgids if pgid != own]
    for pgid in pgids:
        _killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(group_members(p) for p in pgids):
        time.sleep(POLL_SECONDS)
    for pgid in pgids:
        if group_members(pgid):
            _killpg(pgid, signal.SIGKILL)
    _wait_gone(pgids, timeout=5)


def pid_stop(pid: int, *, timeout: float) -> None:
    """SIGTERM one process (not its group), SIGKILL it after ``timeout``."""
    _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(POLL_SECONDS)
    if pid_alive(pid):
        _kill(pid, signal.SIGKILL)


def _wait_gone(pgids: list[int], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(group_members(p) for p in pgids):
        time.sleep(POLL_SECONDS)


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)

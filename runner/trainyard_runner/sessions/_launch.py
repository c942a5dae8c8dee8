"""Starts one process of a session as the job's user: ``python -I -S
_launch.py UID TTY CWD ARGV…`` (UID "" keeps the runner's user; TTY "1":
stdin is the session's terminal). The runner starts it in a new session
(``setsid``); it makes the terminal its controlling one, becomes the job's
uid and gid (no supplementary group, ``no_new_privs``, as ``_shim.py`` does
for the job's commands), enters CWD and execs ARGV on the job's PATH.

A separate program rather than a ``preexec_fn``: the runner has threads,
and Python code must not run between ``fork`` and ``exec`` there.
Standard library only (``-S``: started before every shell and command)."""

from __future__ import annotations

import ctypes
import fcntl
import os
import sys
import termios

PR_SET_NO_NEW_PRIVS = 38


def main() -> int:
    uid, tty, cwd, *argv = sys.argv[1:]
    if tty == "1":
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    if uid:
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    try:
        os.chdir(cwd)
    except OSError as e:
        print(f"trainyard: could not enter {cwd}: {e.strerror}", file=sys.stderr)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"trainyard: could not run {argv[0]}: {e.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())

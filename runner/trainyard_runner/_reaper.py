"""The leader of a job's process group: ends the whole group if the runner dies.

Run as ``python -I -S _reaper.py bash -c SCRIPT`` (standard library only, so
it starts in ~10 ms). PR_SET_PDEATHSIG delivers SIGTERM to this process when
the runner dies, even by SIGKILL; it then SIGKILLs its own process group, so
no grandchild of the job outlives the runner. A SIGTERM while the runner
lives is a cancel (the runner signals the whole group): the job handles it,
and the reaper keeps waiting. Exits with the job's exit code (128 + signal
number when the job was killed by a signal).
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> int:
    runner = os.getppid()

    def on_term(signum: int, frame: object) -> None:
        if os.getppid() != runner:  # orphaned: the runner is gone
            os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_term)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != runner:  # the runner died before prctl took effect
        os.killpg(0, signal.SIGKILL)
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.execvp(sys.argv[1], sys.argv[1:])
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())

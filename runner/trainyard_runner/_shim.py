"""The supervisor of one job ("shim"): the leader of the job's process group.

Run as ``python -I -S _shim.py JOB_DIR OUTLIVE ARGV...`` (standard library
only, so it starts in ~10 ms), with ``OUTLIVE`` "1" or "0":

1. It leads its own session and process group (the job's), and writes
   ``JOB_DIR/shim.json`` {pid, start, boot}: its pid, its start time in clock
   ticks since boot (``/proc/<pid>/stat`` field 22) and the boot id, so a
   runner started later tells it from a reused pid.
2. It forks ARGV (``bash -c SCRIPT``, or ``docker run …``) with stdout and
   stderr appended to ``JOB_DIR/stdout.log`` and ``JOB_DIR/stderr.log``: the
   runner reads them from byte offsets it keeps in the log spool, so the job
   writes on whether or not a runner reads (no pipe, no SIGPIPE).
3. When the child exits it writes ``JOB_DIR/exit.json`` {code, signal,
   ended_at} atomically (code: the exit code, 128 + signal number when the
   child was killed by a signal), then SIGKILLs its whole process group, itself
   included: background processes end with the job.

A SIGTERM to the group is a cancel: the job handles it, the shim ignores it
and keeps waiting. With OUTLIVE "0" the shim also sets PR_SET_PDEATHSIG, so
when the runner dies (even by SIGKILL) it SIGKILLs the group and writes no
exit file: the job died with the runner. With OUTLIVE "1" a dead runner
changes nothing here; the next runner started on the work dir re-attaches.
"""

import ctypes
import json
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1


def main() -> int:
    job_dir, outlive, argv = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
    runner = os.getppid()
    if os.getsid(0) != os.getpid():
        os.setsid()

    def on_term(signum: int, frame: object) -> None:
        if not outlive and os.getppid() != runner:  # orphaned: the runner is gone, and the job with it
            os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_term)
    if not outlive:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != runner:  # the runner died before prctl took effect
            os.killpg(0, signal.SIGKILL)
    me = os.getpid()
    _write(job_dir, "shim.json", {"pid": me, "start": start_ticks(me), "boot": boot_id()})
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    out = os.open(os.path.join(job_dir, "stdout.log"), flags, 0o600)
    err = os.open(os.path.join(job_dir, "stderr.log"), flags, 0o600)
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(out, 1)
        os.dup2(err, 2)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, f"cannot run {argv[0]}: {e.strerror}\n".encode())
        os._exit(127)
    os.close(out)
    os.close(err)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else None
    code = 128 + sig if sig is not None else code
    _write(job_dir, "exit.json", {"code": code, "signal": sig, "ended_at": time.time()})
    os.killpg(0, signal.SIGKILL)
    return code


def start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def _write(job_dir: str, name: str, value: object) -> None:
    path = os.path.join(job_dir, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())

"""The supervisor of one job ("shim"): the leader of the job's process group.

Run as ``python -I -S _shim.py JOB_DIR OUTLIVE ARGV...`` (standard library
only, so it starts in ~10 ms), with ``OUTLIVE`` "1" or "0". Or started ahead
of the job as ``python -I -S _shim.py JOBS_DIR/ standby`` (the runner's
``ShimStandby``): it pays its start-up then, and waits for its job on stdin,
one JSON object {job_dir, outlive, argv, cwd, env} and then the end of the
input (which, alone, tells it to exit: the runner stopped or died). Its
command line names the runner's jobs folder, so the shim of a job it took is
found by it like any other (the local backend's ``kill_shims``). Then:

1. It leads its own session and process group (the job's), and (once the
   child of step 2 is started) writes ``JOB_DIR/shim.json`` {pid, start, boot}: its pid, its start time in clock
   ticks since boot (``/proc/<pid>/stat`` field 22) and the boot id, so a
   runner started later tells it from a reused pid.
2. It forks ARGV (``bash -c SCRIPT``, or ``docker run …``) with stdout and
   stderr appended to ``JOB_DIR/stdout.log`` and ``JOB_DIR/stderr.log``: the
   runner reads them from byte offsets it keeps in the log spool, so the job
   writes on whether or not a runner reads (no pipe, no SIGPIPE).
3. When the child exits it writes ``JOB_DIR/exit.json`` {code, signal,
   ended_at} atomically (code: the exit code, 128 + signal number when the
   child was killed by a signal), then SIGKILLs every process left of the job
   (``_contain_end``), then its whole process group, itself included:
   background processes end with the job.

Containment (nothing of a job outlives it, even what left the process group
with ``setsid`` or a double fork): the shim is a child subreaper
(PR_SET_CHILD_SUBREAPER), so every orphaned descendant is re-parented to it
and killed at the end; where cgroup v2 is mounted and writable it also puts
the job in a cgroup of its own (``trainyard-<mark>`` under its current one,
recorded in ``shim.json``) and kills the cgroup's every process at the end.
Every process of the job inherits ``TRAINYARD_JOB_MARK`` in its environment:
the runner's sweep (process.sweep) finds what is left by it when the shim
itself was SIGKILLed. With ``TRAINYARD_JOB_UID`` (a root runner: the job's
own uid, jobuser.py) the shim stays root and its child becomes that uid
(no groups, ``no_new_privs``) before it execs; at the end every process of
the uid is killed, wherever it went and whatever its environment.

A SIGTERM to the group is a cancel: the job handles it, the shim ignores it
and keeps waiting. With OUTLIVE "0" the shim also sets PR_SET_PDEATHSIG, so
when the runner dies (even by SIGKILL) it SIGKILLs the group and writes no
exit file: the job died with the runner. With OUTLIVE "1" a dead runner
changes nothing here; the next runner started on the work dir re-attaches.
"""

import _signal as signal  # type: ignore[import-not-found]  # the C module: `signal` pulls in enum, ~3 ms of every job's start
import ctypes
import os
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
MARK_VAR = "TRAINYARD_JOB_MARK"
UID_VAR = "TRAINYARD_JOB_UID"  # the job's own uid (and gid), "" to run as the shim's user; not passed on
PR_SET_NO_NEW_PRIVS = 38
CGROUP_ROOT = "/sys/fs/cgroup"
SWEEP_ROUNDS = 20  # a job forking while it is killed: kill again, this many times at most


def main() -> int:
    runner = os.getppid()  # before a standby waits: the runner may die meanwhile
    if sys.argv[2] == "standby":
        job_dir, outlive, argv = _wait_for_job()
    else:
        job_dir, outlive, argv = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
    if os.getsid(0) != os.getpid():
        os.setsid()
    uid = int(os.environ.pop(UID_VAR, "") or 0)

    def on_term(signum: int, frame: object) -> None:
        if not outlive and os.getppid() != runner:  # orphaned: the runner is gone, and the job with it
            _kill_uid(uid)
            os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_term)
    if not outlive:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != runner:  # the runner died before prctl took effect
            _kill_uid(uid)
            os.killpg(0, signal.SIGKILL)
    me = os.getpid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    cgroup = _enter_cgroup(os.environ.get(MARK_VAR, ""))
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    out = os.open(os.path.join(job_dir, "stdout.log"), flags, 0o600)
    err = os.open(os.path.join(job_dir, "stderr.log"), flags, 0o600)
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(out, 1)
        os.dup2(err, 2)
        try:
            if uid:
                _become(uid)
            _exec(argv)
        except OSError as e:
            os.write(2, f"cannot run {argv[0]}: {e.strerror}\n".encode())
        os._exit(127)
    os.close(out)
    os.close(err)
    # Written while the child starts: the job's first line does not wait for it.
    record = {"pid": me, "start": start_ticks(me), "boot": boot_id(), "mark": os.environ.get(MARK_VAR, ""), "uid": uid}
    _write(job_dir, "shim.json", {**record, "cgroup": cgroup})
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else None
    code = 128 + sig if sig is not None else code
    _write(job_dir, "exit.json", {"code": code, "signal": sig, "ended_at": time.time()})
    _contain_end(cgroup, uid)
    os.killpg(0, signal.SIGKILL)
    return code


def _exec(argv: list[str]) -> None:
    """``execvp`` without its lazy ``import warnings``, which the job's user
    may not be able to read (the interpreter under a private folder)."""
    if "/" in argv[0]:
        os.execv(argv[0], argv)
    error: OSError = FileNotFoundError(2, "No such file or directory")
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execv(os.path.join(folder or ".", argv[0]), argv)
        except (FileNotFoundError, NotADirectoryError) as e:
            error = error if isinstance(error, PermissionError) else e
        except PermissionError as e:
            error = e
    raise error


def _become(uid: int) -> None:
    """The job's user: its uid and gid, no supplementary group, and no way
    back up (``no_new_privs``: a setuid program runs with the job's uid)."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of the job's uid: ``kill(-1)`` from a child
    that became the uid reaches them all at once (a job forking meanwhile
    included), wherever they went (``setsid``, a cleared environment)."""
    if not uid:
        return
    child = os.fork()
    if child == 0:
        try:
            _become(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def _wait_for_job() -> tuple[str, bool, list[str]]:
    """Standby: read the job from stdin, then become its shim as if started
    for it: its working directory and environment, stdin from /dev/null,
    stderr to the job's ``shim.log``. Exits when the input ends without one."""
    import json  # here: paid before the job comes (``_write`` needs it too)

    chunks = []
    while chunk := os.read(0, 1 << 16):
        chunks.append(chunk)
    if not chunks:
        raise SystemExit(0)
    job = json.loads(b"".join(chunks))
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(os.path.join(job["job_dir"], "shim.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(null, 0)
    os.dup2(log, 2)  # from here on, what goes wrong is in the job's shim.log
    os.close(null)
    os.close(log)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    return job["job_dir"], bool(job["outlive"]), list(job["argv"])


def _enter_cgroup(mark: str) -> str:
    """Move this process (and so every later child) into a new cgroup v2
    ``trainyard-<mark>`` below its own; its path, or "" where there is no
    writable cgroup v2 (v1, a read-only mount: the subreaper alone contains)."""
    if not mark or not os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        return ""
    try:
        with open("/proc/self/cgroup") as f:
            own = next(line[3:].strip() for line in f if line.startswith("0::"))
        path = os.path.join(CGROUP_ROOT, own.lstrip("/"), f"trainyard-{mark}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except (OSError, StopIteration):
        return ""
    return path


def _contain_end(cgroup: str, uid: int) -> None:
    """SIGKILL every process of the job but this one: the job uid's, the
    cgroup's, and every descendant (orphans were re-parented here: we are
    their subreaper); reap them, until none is left."""
    me = os.getpid()
    for _ in range(SWEEP_ROUNDS):
        _kill_uid(uid)
        doomed = (_cgroup_pids(cgroup) | _descendants(me)) - {me}
        for pid in doomed:
            try:  # noqa: SIM105 - contextlib is not imported: start time
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap()
        if not doomed:
            break
    if cgroup:
        try:  # noqa: SIM105 - contextlib is not imported: start time
            os.rmdir(cgroup)
        except OSError:
            pass


def _cgroup_pids(cgroup: str) -> set[int]:
    if not cgroup:
        return set()
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return {int(line) for line in f if line.strip()}
    except OSError:
        return set()


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _reap() -> None:
    for _ in range(100):  # 1 s at most: what is still exiting is killed again next round
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)  # killed ones are still exiting
            if not _descendants(os.getpid()):
                return


def start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def _write(job_dir: str, name: str, value: object) -> None:
    import json  # here, not at the top: ~3 ms of the job's start (it pulls in re)

    path = os.path.join(job_dir, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())

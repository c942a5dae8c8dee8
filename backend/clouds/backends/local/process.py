"""Runner processes on this host, one per idempotency key, found again by their files.

Used by the ``local`` backend, and by the ``fake`` backend when it runs real
runners. One directory holds, for each key:

    <key>.json  the record: installation, account, instance name, offer, start
                time, and ``terminate_requested_at`` once terminate was asked
    <key>.pid   the runner's pid; ``backend/embedded/runners.py`` reads these
                to kill the runners a crashed server left behind
    <key>.log   the runner's stdout and stderr (appended; kept after the end)
    <key>/      the runner's work directory (``TRAINYARD_RUNNER_DIR``)
    .lock       flock'd around every read and write of the files above, so two
                processes (two Celery workers, a test and a worker) never start
                two runners for one key nor see a half-started one

Files are written atomically (a temporary file, then ``os.replace``). A pid
counts only while ``/proc/<pid>/cmdline`` still names the runner: pids are
reused, and a runner that exited may be a zombie until its parent reaps it.

Each job of a runner runs under a shim (``trainyard_runner/_shim.py``, the
leader of the job's process group). Whether jobs outlive their runner is the
``jobs_outlive_runner`` setting (``TRAINYARD_RUNNER_JOBS_OUTLIVE``): off for
the ``local`` backend (a dead runner is a gone machine, and ``make run``'s
Ctrl-C must leave nothing), on for the ``fake`` backend, whose machines
survive their runner like a cloud VM. Either way, stopping or killing a
runner's machine also SIGKILLs the process group of every shim whose command
line names a job directory under the runner's work directory, and every
process that carries the ``TRAINYARD_JOB_MARK`` of one of its jobs
(``kill_shims``; docs/RUNNER.md, "Containment").
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from backend.clouds.backends.base import AccountConfig, LaunchSpec, Offer
from backend.clouds.backends.config import config_bool, config_float, config_strings
from backend.clouds.backends.errors import InvalidConfig
from backend.clouds.backends.files import KEY_PATTERN, checked_key, locked, write_atomic

# The server's own configuration and credentials, *_FILE variants included: a
# runner (and so every job, which inherits its environment) has no business
# with them.
SERVER_ONLY_PREFIXES = ("DATABASE_", "REDIS_", "DJANGO_", "TRAINYARD_SECRET", "CELERY_", "AWS_", "GITHUB_")
# Set by us for each runner; never inherited from the server's environment.
RUNNER_VARS_PREFIXES = ("TRAINYARD_RUNNER_", "TRAINYARD_SERVER_URL")
RESOURCES_VAR = "TRAINYARD_RUNNER_RESOURCES"  # trainyard_runner.resources reads it
OUTLIVE_VAR = "TRAINYARD_RUNNER_JOBS_OUTLIVE"  # trainyard_runner.__main__ reads it
VOLUMES_VAR = "TRAINYARD_RUNNER_VOLUMES_DIR"  # trainyard_runner.volumes reads it
ENVIRONMENTS_VAR = "TRAINYARD_ENVIRONMENTS_DIR"  # trainyard_runner.job reads it
SHIM_MARKER = b"_shim.py"  # the job supervisor's script, in its command line
# The console script, or ``python -m trainyard_runner``.
RUNNER_MARKERS = (b"trainyard_runner", b"trainyard-runner")
DEFAULT_KILL_AFTER = 10.0

# Runners this process started, so they are reaped (not left as zombies) once
# they exit; a runner another process started is reaped by that process.
_children: dict[int, subprocess.Popen[bytes]] = {}
_children_lock = threading.Lock()


@dataclass(frozen=True)
class RunnerSettings:
    """How runners are started and stopped: config keys ``runner_command``,
    ``env_strip_prefixes`` and ``kill_after``."""

    command: tuple[str, ...]
    strip_prefixes: tuple[str, ...] = SERVER_ONLY_PREFIXES
    kill_after: float = DEFAULT_KILL_AFTER
    jobs_outlive_runner: bool = False

    @classmethod
    def from_config(cls, account: AccountConfig, *, jobs_outlive_runner: bool = False) -> RunnerSettings:
        """``jobs_outlive_runner``: the default of that config key (the fake
        backend's machines survive their runner; the local backend's do not)."""
        command = config_strings(account, "runner_command", [sys.executable, "-m", "trainyard_runner"])
        prefixes = config_strings(account, "env_strip_prefixes", SERVER_ONLY_PREFIXES)
        if not command or "" in prefixes:
            raise InvalidConfig(
                f"the {account.kind} backend's runner_command must not be empty, nor any env_strip_prefixes",
                code="BadConfig",
            )
        return cls(
            command=command,
            strip_prefixes=prefixes,
            kill_after=config_float(account, "kill_after", DEFAULT_KILL_AFTER),
            jobs_outlive_runner=config_bool(account, "jobs_outlive_runner", jobs_outlive_runner),
        )


@dataclass(frozen=True)
class Runner:
    """What the files say about one key. ``pid`` is None when no live runner has it."""

    key: str
    pid: int | None
    record: Mapping[str, object] = field(default_factory=dict)

    @property
    def stopping(self) -> bool:
        return "terminate_requested_at" in self.record


class RunnerDir:
    """The runners of one directory (see the module docstring)."""

    def __init__(self, path: Path, settings: RunnerSettings) -> None:
        self.path = path
        self.settings = settings

    def start(
        self, spec: LaunchSpec, *, record: Mapping[str, object], resources: Mapping[str, object] | None
    ) -> Runner:
        """Start a runner for ``spec.idempotency_key``, detached in its own
        session. Idempotent: a live runner for the key is returned as it is.
        ``resources`` (an ``offer_resources`` dict) is what its Hello reports;
        None lets the runner detect the host. Raises ``InvalidConfig`` naming
        the command when it cannot be started."""
        key = checked_key(spec.idempotency_key)
        with self._locked():
            current = self._find(key)
            if current is not None and current.pid is not None:
                return current
            record = {**record, "started_at": time.time()}
            write_atomic(self.path / f"{key}.json", json.dumps(record))
            try:
                pid = self._spawn(key, self._env(key, spec, resources))
            except OSError as exc:
                self._forget(key)
                raise InvalidConfig(
                    f"cannot start the runner command {shlex.join(self.settings.command)!r}: {exc}",
                    code="RunnerCommandFailed",
                ) from exc
            write_atomic(self.path / f"{key}.pid", f"{pid}\n")
            return Runner(key=key, pid=self._check_started(key, pid), record=record)

    def find(self, key: str) -> Runner | None:
        """None when the directory has no file for ``key``."""
        with self._locked():
            return self._find(checked_key(key))

    def all(self) -> list[Runner]:
        """Every key with a record or a pidfile, live or not."""
        with self._locked():
            keys = {p.stem for p in self.path.glob("*.json")} | {p.stem for p in self.path.glob("*.pid")}
            found = (self._find(key) for key in sorted(keys) if KEY_PATTERN.fullmatch(key))
            return [runner for runner in found if runner is not None]

    def stop(self, key: str) -> bool:
        """Stop the runner of ``key``; True once it is gone and its pid and
        record are deleted (the log and work directory stay).

        1. No files, or no live runner: delete the files, True.
        2. The first request: note its time in the record, SIGTERM the
           runner's process group (the runner cancels its job and exits).
        3. Still alive ``kill_after`` seconds after the first request: SIGKILL
           the group.
        4. False while it is alive: call again.
        5. Once it is gone, its jobs' shims are SIGKILLed with their process
           groups (jobs that outlive their runner would go on otherwise).
        """
        key = checked_key(key)
        with self._locked():
            runner = self._find(key)
            if runner is not None and runner.pid is not None:
                self._signal_stop(runner, runner.pid)
                if _runner_alive(runner.pid):
                    return False
            kill_shims(self.path / key)
            self._forget(key)
            return True

    def kill(self, key: str) -> None:
        """SIGKILL the runner's group now and keep its files (the machine was
        reclaimed: the fake backend's interruption)."""
        with self._locked():
            runner = self._find(checked_key(key))
            if runner is not None and runner.pid is not None:
                _signal_group(runner.pid, signal.SIGKILL)
                # SIGKILL is delivered asynchronously: the caller is told the
                # machine is gone, so it must be gone when this returns.
                _wait_gone(runner.pid, timeout=2.0)
            kill_shims(self.path / checked_key(key))

    def _find(self, key: str) -> Runner | None:
        record = _read_record(self.path / f"{key}.json")
        pid = _read_pid(self.path / f"{key}.pid")
        if record is None and pid is None:
            return None
        live = pid if pid is not None and _runner_alive(pid) else None
        return Runner(key=key, pid=live, record=record or {})

    def _signal_stop(self, runner: Runner, pid: int) -> None:
        requested = runner.record.get("terminate_requested_at")
        if not isinstance(requested, int | float):
            record = {**runner.record, "terminate_requested_at": time.time()}
            write_atomic(self.path / f"{runner.key}.json", json.dumps(record))
            # Once only: the runner takes a second SIGTERM as "exit now", without draining its logs.
            _signal_group(pid, signal.SIGTERM)
        elif time.time() - requested >= self.settings.kill_after:
            _signal_group(pid, signal.SIGKILL)
            _wait_gone(pid, timeout=1.0)

    def _spawn(self, key: str, env: Mapping[str, str]) -> int:
        with open(self.path / f"{key}.log", "ab") as log:
            proc = subprocess.Popen(
                self.settings.command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        with _children_lock:
            _children[proc.pid] = proc
        return proc.pid

    def _check_started(self, key: str, pid: int) -> int | None:
        """``pid`` once the kernel shows its command line (Popen returns
        before exec has filled it in, and an empty one looks like a zombie's);
        None when it already exited. A command whose process never shows the
        runner's name could never be found again: it is killed and refused."""
        raw = _cmdline_after_exec(pid)
        if raw is None:
            return None  # it exited at once; its log says why
        if names_runner(raw):
            # Not read again: a wrapper that execs the runner shows an empty
            # command line for a moment, which reads as a zombie's.
            return pid
        _signal_group(pid, signal.SIGKILL)
        self._forget(key)
        command = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        raise InvalidConfig(
            f"the runner command {shlex.join(self.settings.command)!r} runs as {command!r}, which does not name"
            " trainyard-runner or trainyard_runner: its runners could not be told from other processes",
            code="RunnerCommandUnrecognisable",
        )

    def _env(self, key: str, spec: LaunchSpec, resources: Mapping[str, object] | None) -> dict[str, str]:
        dropped = (*self.settings.strip_prefixes, *RUNNER_VARS_PREFIXES)
        env = {name: value for name, value in os.environ.items() if not name.startswith(dropped)}
        # A home of its own: what a job keeps under ~ (a cache: ~/.cache/pip,
        # dotfiles) stays with this runner, not in the server's home, which
        # every workspace's local runners share.
        home = self.path / key / "home"
        home.mkdir(parents=True, exist_ok=True)
        env.update(
            HOME=str(home),
            TRAINYARD_SERVER_URL=ws_url(spec.server_url),
            TRAINYARD_RUNNER_TOKEN=spec.runner_token,
            TRAINYARD_RUNNER_DIR=str(self.path / key),
            TRAINYARD_RUNNER_ADDRESS="127.0.0.1",
            TRAINYARD_RUNNER_JOBS_OUTLIVE="1" if self.settings.jobs_outlive_runner else "0",
            # The server's own host: no job writes or reads outside its runner's folders.
            TRAINYARD_RUNNER_ABSOLUTE_PATHS="0",
        )
        workspace = spec.tags.get("trainyard:workspace", "")
        if workspace:
            # Job environments (runner/environments.py) are built once for
            # the workspace's runners on this host: another workspace's jobs
            # could change what is in them, so they never share one.
            env[ENVIRONMENTS_VAR] = str(self.path / "environments" / workspace)
            env[VOLUMES_VAR] = str(volumes_dir(self.path, workspace))
        if resources is not None:
            env[RESOURCES_VAR] = json.dumps(resources)
        return env

    def _forget(self, key: str) -> None:
        for suffix in (".pid", ".json"):
            (self.path / f"{key}{suffix}").unlink(missing_ok=True)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return locked(self.path)


def offer_resources(offer: Offer) -> dict[str, object]:
    """``offer``'s resources as the runner's ``TRAINYARD_RUNNER_RESOURCES`` JSON."""
    return {
        "cpus": offer.cpus,
        "memory_bytes": offer.memory_bytes,
        "disk_bytes": offer.disk_bytes,
        "gpus": [gpu.to_data() for gpu in offer.gpus],
    }


def volumes_dir(runners_dir: Path, workspace_id: str) -> Path:
    """Where the workspace's local volumes are folders: its local runners see only these."""
    return runners_dir / "volumes" / str(workspace_id)


def kill_shims(work_dir: Path) -> list[int]:
    """SIGKILL the process group of every job shim of the runner work
    directory ``work_dir`` (a shim's command line is ``python -I -S …/_shim.py
    <work_dir>/jobs/<job> …``, and it leads its job's group); their pids."""
    jobs = os.fsencode(str(work_dir / "jobs")) + b"/"
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        at = next((i for i, arg in enumerate(argv) if arg.endswith(SHIM_MARKER)), None)
        if at is None or at + 1 >= len(argv) or not argv[at + 1].startswith(jobs):
            continue
        pid = int(entry.name)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
                killed.append(pid)
    _kill_marked(work_dir)
    _kill_job_users(work_dir)
    return killed


def _kill_marked(work_dir: Path) -> None:
    """SIGKILL what left a job's process group (``setsid``, a double fork):
    every process whose environment carries the ``TRAINYARD_JOB_MARK`` its
    shim recorded in ``shim.json`` (docs/RUNNER.md, "Containment"). The
    shim that would have killed them was just SIGKILLed with its group."""
    needles = []
    for record in (work_dir / "jobs").glob("*/shim.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            mark = json.loads(record.read_text()).get("mark")
            if isinstance(mark, str) and mark:
                needles.append(f"TRAINYARD_JOB_MARK={mark}\0".encode())
    if not needles:
        return
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(needle in environ for needle in needles):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def _kill_job_users(work_dir: Path) -> None:
    """SIGKILL every process of the uids the work dir's jobs ran as (the
    ``uid`` of each ``shim.json``; a root runner gives each job one of its
    own, docs/RUNNER.md "The job's user"): what left the group and cleared
    its environment too. A uid with live processes is never given to
    another job, so they are this job's."""
    uids = set()
    for record in (work_dir / "jobs").glob("*/shim.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            uids.add(int(json.loads(record.read_text()).get("uid") or 0))
    uids.discard(0)
    for _ in range(20):  # a job forking while it is killed: again, this many times at most
        doomed = [pid for pid, owners in _process_uids() if owners & uids]
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not doomed:
            return
        time.sleep(0.01)


def _process_uids() -> list[tuple[int, set[int]]]:
    """(pid, its real, effective, saved and filesystem uids) of every live process."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        if "\nState:\tZ" in status:
            continue
        line = next((line for line in status.splitlines() if line.startswith("Uid:")), "")
        found.append((int(entry.name), {int(v) for v in line.split()[1:]}))
    return found


def ws_url(server_url: str) -> str:
    """The runner's websocket base URL for the server's ``http(s)://`` URL."""
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if server_url.startswith(http):
            return ws + server_url.removeprefix(http)
    return server_url


def _runner_alive(pid: int) -> bool:
    _reap_children()
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # A zombie's cmdline is empty; a reused pid names something else.
    return names_runner(cmdline)


def names_runner(cmdline: bytes) -> bool:
    """Whether a ``/proc/<pid>/cmdline`` is a runner's: the console script,
    or ``python -m trainyard_runner`` as this backend starts it."""
    return any(marker in cmdline for marker in RUNNER_MARKERS)


def _cmdline_after_exec(pid: int, timeout: float = 2.0) -> bytes | None:
    """The command line of a process that just started, once it names the
    runner, or as it is ``timeout`` seconds on; None when it is gone (or a
    zombie) first. Popen returns before exec has filled the command line in,
    and a wrapper (``sh -c 'exec trainyard-runner'``) shows its own command
    line until it execs the runner: only a command line that never names
    the runner is the wrong command."""
    deadline = time.monotonic() + timeout
    while True:
        _reap_children()
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return None
        if state in ("Z", "X"):
            return None
        if names_runner(raw) or time.monotonic() > deadline:
            return raw
        time.sleep(0.002)


def _reap_children() -> None:
    with _children_lock:
        for pid, proc in list(_children.items()):
            if proc.poll() is not None:
                del _children[pid]


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """The whole group when ``pid`` leads one (runners do: start_new_session),
    else the process alone, so we never signal a group it merely joined."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _wait_gone(pid: int, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _runner_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _read_record(path: Path) -> dict[str, object] | None:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: the key exists, its details are lost
    return value if isinstance(value, dict) else {}


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None

"""A whole Trainyard stack for end-to-end tests: web, Celery worker and beat.

``Stack`` runs the real processes against the Postgres and Redis/Valkey
servers of ``DATABASE_URL`` / ``REDIS_URL`` (``make test`` starts embedded
ones), isolated from everything else that uses those servers:

- a fresh database ``trainyard_e2e_<random>``, migrated, dropped at the end;
- its own Redis database index (``E2E_REDIS_DB``), flushed before and after;
- its own ``TRAINYARD_DATA_DIR`` (a tmp dir) with one log file per process
  under ``logs/``, and free ports on 127.0.0.1.

Tests drive it through ``url`` / ``ws_url``, ``env`` (for CLI and runner
subprocesses), ``manage()``, ``issue_token()``, ``stop()`` / ``start()`` /
``restart()`` of one process to test crash and restart behaviour, ``pause()``
/ ``resume()`` to freeze one (SIGSTOP / SIGCONT), and ``runner_processes()``
to see what its local runners left running.

``reported(fixture, stack)`` registers a stack whose process logs are attached
to the failure report of every test that uses ``fixture`` (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil

from backend.embedded.processes import groups_stop
from backend.embedded.runners import local_runners_kill
from tests.support.urls import url_with_path

REPO_ROOT = Path(__file__).resolve().parents[2]
# Several suites may share one Redis server (a developer's worktrees): each picks its own index.
E2E_REDIS_DB = int(os.environ.get("TRAINYARD_E2E_REDIS_DB", "5"))
READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 10.0
MANAGE_TIMEOUT_SECONDS = 180.0
PROCESS_NAMES = ("web", "worker", "beat")
# A line each process logs once it is serving (the web is checked over HTTP).
READY_MARKERS = {"worker": " ready.", "beat": "beat: Starting..."}


class StackError(RuntimeError):
    """A stack process failed to start or died."""


class Stack:
    """Web, worker and beat on a private database, Redis db and data dir."""

    processes: tuple[str, ...] = PROCESS_NAMES  # started in this order by start_all()

    def __init__(self, *, database_url: str, redis_url: str, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.logs_dir = data_dir / "logs"
        self.database_name = f"trainyard_e2e_{secrets.token_hex(4)}"
        self.database_url = url_with_path(database_url, self.database_name)
        self._admin_database_url = url_with_path(database_url, "postgres")
        self.redis_url = url_with_path(redis_url, E2E_REDIS_DB)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.env = self._environment()
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._database_created = False

    def start_all(self) -> None:
        """1. Create the database, 2. flush the Redis db, 3. migrate, 4. start web, worker, beat."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        _database_execute(self._admin_database_url, f'CREATE DATABASE "{self.database_name}"')
        self._database_created = True
        self._redis_flush()
        self.manage("migrate", "--noinput")
        self._start_processes()

    def close(self) -> None:
        """Stop every process and local runner, drop the database, flush the Redis db."""
        groups_stop([p.pid for p in self._processes.values() if p.poll() is None], timeout=STOP_TIMEOUT_SECONDS)
        for process in self._processes.values():
            process.wait()
        self._processes.clear()
        local_runners_kill(self.data_dir)
        if self._database_created:
            _database_execute(self._admin_database_url, f'DROP DATABASE IF EXISTS "{self.database_name}" WITH (FORCE)')
            self._database_created = False
        self._redis_flush()

    def start(self, name: str) -> None:
        """Start one process (web, worker or beat) and wait until it is ready."""
        self.start_together([name])

    def start_together(self, names: Iterable[str]) -> None:
        """Start several processes at once, then wait until each is ready."""
        started = [(name, *self._launch(name)) for name in names]
        for name, log_path, offset in started:
            self._wait_ready(name, log_path, offset)

    def stop(self, name: str, *, sig: signal.Signals = signal.SIGTERM) -> int | None:
        """Stop one process's group; SIGKILL after 10 s. ``sig=SIGKILL`` simulates a crash."""
        process = self._processes.pop(name, None)
        if process is None:
            return None
        if sig == signal.SIGKILL:
            os.killpg(process.pid, signal.SIGKILL)
        groups_stop([process.pid], timeout=STOP_TIMEOUT_SECONDS)
        return process.wait()

    def restart(self, name: str) -> None:
        self.stop(name)
        self.start(name)

    @contextlib.contextmanager
    def env_changed(self, extra: dict[str, str], *, restart: Iterable[str]) -> Iterator[None]:
        """``extra`` in the processes' environment while the block runs:
        ``restart`` are restarted with it, and again with the old values after."""
        names = list(restart)
        saved = {key: self.env.get(key) for key in extra}
        self.env.update(extra)
        for name in names:
            self.restart(name)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    self.env.pop(key, None)
                else:
                    self.env[key] = value
            for name in names:
                self.restart(name)

    def pause(self, name: str) -> None:
        """Freeze one process's group (SIGSTOP), as a stalled host or VM would."""
        os.killpg(self._processes[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.killpg(self._processes[name].pid, signal.SIGCONT)

    def pid(self, name: str) -> int:
        """The pid of one running process (web, worker or beat)."""
        return self._processes[name].pid

    def running(self, name: str) -> bool:
        process = self._processes.get(name)
        return process is not None and process.poll() is None

    def manage(self, *args: str) -> str:
        """Run ``manage.py <args>`` against the e2e database; return stdout; raise on failure."""
        result = subprocess.run(
            [sys.executable, str(REPO_ROOT / "manage.py"), *args],
            cwd=REPO_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=MANAGE_TIMEOUT_SECONDS,
        )
        if result.returncode != 0:
            raise StackError(
                f"manage.py {' '.join(args)} exited with {result.returncode}\n"
                f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            )
        return result.stdout

    def issue_token(self, username: str) -> str:
        return self.manage("issue_token", username).strip()

    def runner_processes(self) -> list[str]:
        """Live local runners of this stack and their jobs' processes ("pid
        command line"): every process whose TRAINYARD_RUNNER_DIR (set by the
        local backend, inherited by jobs) is under this stack's data dir."""
        runners_dir = str(self.data_dir / "local-runners")
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if proc.environ().get("TRAINYARD_RUNNER_DIR", "").startswith(runners_dir):
                    found.append(f"{proc.pid} {' '.join(proc.cmdline())}")
            except psutil.Error:
                continue
        return found

    def logs_tail(self, lines: int = 60) -> str:
        """The last ``lines`` lines of each process's log, for failure reports."""
        parts = []
        for log_path in sorted(self.logs_dir.glob("*.log")):
            with open(log_path, errors="replace") as log:
                tail = "".join(deque(log, maxlen=lines))
            parts.append(f"===== {log_path.name} (last {lines} lines) =====\n{tail}")
        return "\n".join(parts)

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis_url,
            TRAINYARD_DATA_DIR=str(self.data_dir),
            TRAINYARD_PUBLIC_URL=self.url,
            TRAINYARD_HOST="127.0.0.1",
            TRAINYARD_PORT=str(self.port),
            DJANGO_SETTINGS_MODULE="backend.config.settings",
            PYTHONUNBUFFERED="1",
            # The runner's wheels for booting machines: made once, kept across sessions.
            TRAINYARD_RUNNER_WHEELHOUSE=os.environ.get(
                "TRAINYARD_RUNNER_WHEELHOUSE", str(REPO_ROOT / ".trainyard-data" / "test-runner-wheels")
            ),
        )
        return env

    def _command(self, name: str) -> list[str]:
        python = sys.executable
        if name == "web":
            return [
                python, "-m", "uvicorn", "backend.config.asgi:application",
                "--host", "127.0.0.1", "--port", str(self.port),
            ]  # fmt: skip
        if name == "worker":
            return [
                *(python, "-m", "celery", "-A", "backend.config", "worker", "-l", "info", "--concurrency", "2"),
                # As backend/embedded/supervisor.py runs it (docs/DEPLOY.md).
                *("--without-gossip", "--without-mingle"),
            ]
        if name == "beat":
            schedule = self.data_dir / "celerybeat-schedule"
            return [python, "-m", "celery", "-A", "backend.config", "beat", "-l", "info", "-s", str(schedule)]
        raise ValueError(f"unknown stack process {name!r}; one of {PROCESS_NAMES}")

    def _start_processes(self) -> None:
        for name in self.processes:
            self.start(name)

    def _launch(self, name: str) -> tuple[Path, int]:
        """Start ``name``; return its log and where this start's output begins in it."""
        if name in self._processes and self._processes[name].poll() is None:
            raise StackError(f"{name} is already running")
        log_path = self.logs_dir / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            log.write(f"----- starting {name} at {time.strftime('%H:%M:%S')} -----\n".encode())
            log.flush()
            self._processes[name] = subprocess.Popen(
                self._command(name),
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return log_path, offset

    def _wait_ready(self, name: str, log_path: Path, offset: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            process = self._processes[name]
            if process.poll() is not None:
                raise StackError(f"{name} exited with code {process.returncode} while starting; see {log_path}")
            if self._ready(name, log_path, offset):
                return
            time.sleep(0.2)
        raise StackError(f"{name} was not ready within {READY_TIMEOUT_SECONDS:.0f} s; see {log_path}")

    def _ready(self, name: str, log_path: Path, offset: int) -> bool:
        if name == "web":
            return _http_ok(f"{self.url}/api/v1/health/")
        with open(log_path, "rb") as log:
            log.seek(offset)
            return READY_MARKERS[name].encode() in log.read()

    def rate_limits_reset(self) -> None:
        """Forget every rate-limit window of this stack. A test that floods
        the API from this machine's address (the fuzzer) would otherwise leave
        the address's windows used up for the tests after it: in life, such a
        client is somebody else's address."""
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_timeout=10)
        try:
            keys = list(client.scan_iter(match="*:ratelimit:*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()

    def _redis_flush(self) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_timeout=10)
        try:
            client.flushdb()
        finally:
            client.close()


# fixture name → the stack whose logs a failing test that uses it gets.
REPORTED: dict[str, Stack] = {}


def reported(fixture: str, stack: Stack) -> Stack:
    REPORTED[fixture] = stack
    return stack


def _database_execute(admin_url: str, statement: str, *, tries: int = 5) -> None:
    """Tried again when the connection is lost: a test that restarted the
    server (tests/e2e/test_outages.py) may leave it briefly unavailable."""
    import psycopg

    for attempt in range(1, tries + 1):
        try:
            with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
                conn.execute(statement)  # type: ignore[arg-type]  # names are ours, never user input
            return
        except psycopg.OperationalError:
            if attempt == tries:
                raise
            time.sleep(1.0)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


__all__ = ["E2E_REDIS_DB", "REPORTED", "Stack", "StackError", "reported"]

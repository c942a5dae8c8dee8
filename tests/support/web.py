"""The real ASGI server (uvicorn, as production runs it) on the test database.

``web_server(**env)`` (the fixture in tests/conftest.py) starts
``uvicorn backend.config.asgi:application`` in a subprocess against the
database pytest-django made and the suite's Redis, with ``env`` added (e.g. a
short re-check interval). Tests that use it must commit what the server is to
see: ``pytest.mark.django_db(transaction=True)``. Lighter than the e2e
``stack``: no worker, no beat, no runners.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.stack import REPO_ROOT, _free_port, _http_ok
from tests.support.testdb import django_test_db_url

READY_TIMEOUT_SECONDS = 30.0


class WebServer:
    def __init__(self, *, data_dir: Path, env: dict[str, str], args: tuple[str, ...] = ()) -> None:
        self.args = args
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.log_path = data_dir / "web.log"
        self.env = {
            **os.environ,
            "DATABASE_URL": django_test_db_url(),
            "TRAINYARD_DATA_DIR": str(data_dir),
            "TRAINYARD_PUBLIC_URL": self.url,
            "DJANGO_SETTINGS_MODULE": "backend.config.settings",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> WebServer:
        command = [sys.executable, "-m", "uvicorn", "backend.config.asgi:application",
                   "--host", "127.0.0.1", "--port", str(self.port), *self.args]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command, cwd=REPO_ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not _http_ok(f"{self.url}/api/v1/health/"):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the web server did not start; its log:\n{self.log()}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def kill(self) -> None:
        """SIGKILL: the process dies without any clean-up, as in a crash."""
        if self._process is None:
            return
        self._process.kill()
        self._process.wait()
        self._process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class WebServers:
    """What the ``web_server`` fixture gives: ``start(**env)``; ``logs_tail()`` for failure reports."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.started: list[WebServer] = []

    def start(self, **env: str) -> WebServer:
        return self.start_with((), **env)

    def start_with(self, args: tuple[str, ...], **env: str) -> WebServer:
        """Started with uvicorn's own ``args`` added (e.g. ``--lifespan off``)."""
        data_dir = self.data_dir / f"web-{len(self.started)}"
        data_dir.mkdir(parents=True)
        server = WebServer(data_dir=data_dir, env=env, args=args)
        self.started.append(server)
        return server.start()

    def stop_all(self) -> None:
        for server in self.started:
            server.stop()

    def logs_tail(self, lines: int = 60) -> str:
        return "\n".join(
            f"===== web server on port {s.port} (last {lines} lines) =====\n" + "\n".join(s.log().splitlines()[-lines:])
            for s in self.started
        )

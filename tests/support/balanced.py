"""Trainyard scaled out on this machine: two web processes, two Celery
workers and beat against one Postgres and one Redis, behind Debian's haproxy
running deploy/haproxy.cfg (the file docker-compose.yml uses).

``BalancedStack`` is a ``Stack`` (tests/support/stack.py) whose processes are
``web-1``, ``web-2``, ``worker-1``, ``worker-2``, ``beat`` and ``balancer``;
``url`` / ``ws_url`` are the balancer's, and so is the public URL runners
connect to. ``web_url(name)`` / ``web_ws_url(name)`` reach one web process
directly, ``websockets_on(name)`` asks haproxy how many websockets it holds
open to it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from backend.embedded.services import EmbeddedServices
from tests.support.stack import REPO_ROOT, Stack, _free_port, _http_ok, reported

HAPROXY_CONFIG = REPO_ROOT / "deploy" / "haproxy.cfg"
WEBS = ("web-1", "web-2")
WORKERS = ("worker-1", "worker-2")


def haproxy_path() -> str:
    """Debian installs it in /usr/sbin, often not on a user's PATH."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise RuntimeError(
            "haproxy is not installed: tests/e2e/test_scale_out.py runs Trainyard behind it. "
            "`make test` installs the Debian package haproxy when run as root; otherwise: apt-get install haproxy"
        )
    return found


class BalancedStack(Stack):
    processes = (*WEBS, *WORKERS, "beat", "balancer")

    def __init__(self, *, database_url: str, redis_url: str, data_dir: Path) -> None:
        self.haproxy = haproxy_path()
        super().__init__(database_url=database_url, redis_url=redis_url, data_dir=data_dir)
        self.web_ports = {name: _free_port() for name in WEBS}
        self.stats_socket = data_dir / "haproxy.sock"
        self.env.update(
            TRAINYARD_LB_BIND=f"127.0.0.1:{self.port}",
            TRAINYARD_LB_STATS_SOCKET=str(self.stats_socket),
            TRAINYARD_WEB_1=f"127.0.0.1:{self.web_ports['web-1']}",
            TRAINYARD_WEB_2=f"127.0.0.1:{self.web_ports['web-2']}",
        )

    def web_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.web_ports[name]}"

    def web_ws_url(self, name: str) -> str:
        return f"ws://127.0.0.1:{self.web_ports[name]}"

    def websockets_on(self) -> dict[str, int]:
        """Open connections from haproxy to each web process (``scur`` of
        ``show stat``): a plain request holds one only while it is answered,
        a websocket for as long as it lives."""
        rows = self._haproxy_command("show stat").splitlines()
        header = rows[0].lstrip("# ").split(",")
        counts = {}
        for row in rows[1:]:
            fields = dict(zip(header, row.split(","), strict=False))
            if fields.get("pxname") == "web" and fields.get("svname") in WEBS:
                counts[fields["svname"]] = int(fields["scur"])
        return counts

    def servers_up(self) -> dict[str, bool]:
        rows = self._haproxy_command("show stat").splitlines()
        header = rows[0].lstrip("# ").split(",")
        states = {}
        for row in rows[1:]:
            fields = dict(zip(header, row.split(","), strict=False))
            if fields.get("pxname") == "web" and fields.get("svname") in WEBS:
                states[fields["svname"]] = fields["status"].startswith("UP")
        return states

    def _haproxy_command(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats_socket))
            sock.sendall(f"{command}\n".encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def _start_processes(self) -> None:
        """Together, to start in seconds; the balancer last (it waits for both webs to pass its checks)."""
        self.start_together(self.processes[:-1])
        self.start("balancer")

    def _command(self, name: str) -> list[str]:
        if name in WEBS:  # as backend/embedded starts the web
            return [
                sys.executable, "-m", "uvicorn", "backend.config.asgi:application",
                "--host", "127.0.0.1", "--port", str(self.web_ports[name]),
            ]  # fmt: skip
        if name in WORKERS:
            return [
                sys.executable, "-m", "celery", "-A", "backend.config", "worker", "-l", "info",
                "--concurrency", "2", "--hostname", f"{name}@%h", "--without-gossip", "--without-mingle",
            ]  # fmt: skip
        if name == "balancer":
            return [self.haproxy, "-db", "-f", str(HAPROXY_CONFIG)]
        return super()._command(name)

    def _ready(self, name: str, log_path: Path, offset: int) -> bool:
        if name in WEBS:
            return _http_ok(f"{self.web_url(name)}/api/v1/health/")
        if name in WORKERS:
            return super()._ready("worker", log_path, offset)
        if name == "balancer":
            try:
                return sorted(self.servers_up().items()) == [(web, True) for web in WEBS]
            except OSError:  # the stats socket is not there yet
                return False
        return super()._ready(name, log_path, offset)


@contextlib.contextmanager
def balanced_stack(root: Path, name: str, **env: str) -> Iterator[BalancedStack]:
    """A started ``BalancedStack`` on the suite's Postgres (a database of its
    own) and a Redis of its own (it must not share queues with the session's
    stack), with ``env`` added; reported as ``name``; stopped at the end."""
    redis = EmbeddedServices(data_dir=root / "valkey", postgres=False, valkey_port=_free_port())
    redis.start()
    assert redis.urls.redis_url
    stack = BalancedStack(database_url=os.environ["DATABASE_URL"], redis_url=redis.urls.redis_url, data_dir=root)
    stack.env.update(env)
    reported(name, stack)
    try:
        stack.start_all()
        yield stack
    finally:
        stack.close()
        redis.stop()

"""Runner tests: plain pytest, no Django (the runner package has no Django)."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


def run_git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def git() -> Callable[..., str]:
    """``git(cwd, *args)`` → stdout; raises on failure."""
    return run_git


@pytest.fixture
def drop(tmp_path: Path) -> Path:
    """A folder every job may write to (1777), for the marks a test's jobs
    leave: a root runner's jobs run as users of their own (docs/RUNNER.md,
    "The job's user"), who may not write in ``tmp_path``."""
    from trainyard_runner.jobuser import make_reachable

    path = tmp_path / "drop"
    path.mkdir()
    path.chmod(0o1777)
    make_reachable(tmp_path)
    return path


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repository with one commit; returns (path, commit)."""
    path = tmp_path / "repo"
    path.mkdir()
    run_git(path, "init", "-q", "-b", "main")
    run_git(path, "config", "user.email", "t@example.com")
    run_git(path, "config", "user.name", "t")
    (path / "train.py").write_text("print('v1')\n")
    run_git(path, "add", "-A")
    run_git(path, "commit", "-qm", "init")
    return path, run_git(path, "rev-parse", "HEAD")


class FileServer:
    """A small HTTP server of ``files`` {url path: bytes} with ``Range``
    support. ``faults[path]`` is a list of what the next GETs of that path do
    instead of answering normally: an HTTP status (e.g. 503), or "cut" (send
    the headers and half of the body, then close), or "slow" (1 KB every 50 ms)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.faults: dict[str, list[int | str]] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.base = ""

    def add(self, path: str, data: bytes) -> tuple[str, int, str]:
        """Serve ``data`` at ``path``; returns (url, size, sha256)."""
        self.files[path] = data
        return f"{self.base}{path}?sig=s3cr3t", len(data), hashlib.sha256(data).hexdigest()

    def serve_input(self, job: dict[str, Any], path: str, files: list[dict[str, Any]]) -> None:
        """Make ``job`` (an AssignJob dict) have one input at ``path`` whose
        file list this server answers as the runner REST endpoint does (one page)."""
        job["api_url"] = f"{self.base}/api/v1"
        job["inputs"] = [{"path": path, "file_count": len(files)}]
        page = {"path": path, "files": files, "next": ""}
        self.files[f"/api/v1/runner/jobs/{job['job']}/inputs/"] = json.dumps(page).encode()


@pytest.fixture
def file_server() -> Iterator[FileServer]:
    state = FileServer()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            state.requests.append((path, self.headers.get("Range")))
            data = state.files.get(path)
            faults = state.faults.get(path)
            fault = faults.pop(0) if faults else None
            if data is None or isinstance(fault, int):
                self.send_error(fault if isinstance(fault, int) else 404)
                return
            start = 0
            if self.headers.get("Range"):
                start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-"))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if fault == "slow":  # 1 KB every 50 ms
                for i in range(0, len(body), 1024):
                    self.wfile.write(body[i : i + 1024])
                    self.wfile.flush()
                    time.sleep(0.05)
                return
            if fault == "cut":
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.base = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield state
    server.shutdown()

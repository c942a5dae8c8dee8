"""A fake Trainyard for CLI tests: REST through httpx.MockTransport, the run
websocket through a real websockets server on a loopback port."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from click.testing import CliRunner
from trainyard.api import Client
from trainyard.cli import cli
from websockets.sync.server import ServerConnection, serve

from tests.support.frames import logs_frame

TOKEN = "trainyard_test"

WS = "/api/v1/workspaces/ws1"


HEALTH = ("GET", "/api/v1/health/")


class FakeRest:
    """Records requests; answers from a {(method, path): response} table.
    The server's limits (``GET /api/v1/health/``, asked before a run's code is
    uploaded) are answered with the default unless the table has them, and
    not recorded."""

    def __init__(self, routes: dict[tuple[str, str], httpx.Response]) -> None:
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        if (request.method, request.url.path) == HEALTH and HEALTH not in self.routes:
            return httpx.Response(200, json={"status": "ok", "max_blob_bytes": 512 * 2**20})
        self.requests.append(request)
        if request.url.host == "storage.fake":  # the signed URL never gets the token
            assert "Authorization" not in request.headers
        else:
            assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        return self.routes[(request.method, request.url.path)]


def use(monkeypatch: pytest.MonkeyPatch, url: str, rest: FakeRest) -> None:
    monkeypatch.setattr("trainyard.commands.common.client", lambda: rest_client(url, rest))


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def make_job(
    status: str,
    *,
    id: str = "job-1",
    name: str = "hello",
    last_seq: int = 0,
    exit_code: int | None = None,
    reason: str = "",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "id": id, "name": name, "status": status, "status_reason": reason, "exit_code": exit_code,
        "attempt": 1, "instance": None, "resources": {}, "created_at": "2026-01-01T00:00:00Z",
        "started_at": None, "finished_at": None, "last_seq": last_seq,
        "needs": [], "after_running": [], "cached_from": None, "inputs": [], **extra,
    }  # fmt: skip


def make_run(
    status: str,
    *,
    last_seq: int = 0,
    exit_code: int | None = None,
    reason: str = "",
    name: str = "brave-otter-1",
    jobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "id": "run-uuid", "name": name, "workflow": "hello", "status": status, "status_reason": reason,
        "exit_code": exit_code, "submitted_by": "alice", "created_at": "2026-01-01T00:00:00Z",
        "started_at": None, "finished_at": None, "duration_seconds": 3.0,
        "code": {"kind": "archive"}, "jobs": jobs if jobs is not None else [make_job(status, last_seq=last_seq, exit_code=exit_code, reason=reason)],
    }  # fmt: skip


class FakeRunSocket:
    """Serves one run: the stored ``lines`` after ``after_seq``, then the
    final run. The first ``drops`` connections are cut after ``drop_after``
    lines, to exercise reconnects."""

    def __init__(
        self,
        lines: list[list[Any]],
        *,
        final: dict[str, Any],
        drops: int = 0,
        drop_after: int = 0,
        close_code: int | None = None,
        job_of: Callable[[list[Any]], str] = lambda line: "job-1",
        refusals: list[tuple[int, str]] | None = None,
    ) -> None:
        self.lines, self.final, self.job_of = lines, final, job_of
        self.drops, self.drop_after, self.close_code = drops, drop_after, close_code
        self.refusals = list(refusals or [])  # the first connections are accepted, then closed with these
        self.after_seqs: list[int] = []
        self.port = 0

    def handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        if ws.request.headers.get("Authorization") != f"Bearer {TOKEN}":
            ws.close(4401)
            return
        if self.close_code:
            ws.close(self.close_code)
            return
        if self.refusals:
            ws.close(*self.refusals.pop(0))
            return
        after = int(parse_qs(urlparse(ws.request.path).query)["after_seq"][0])
        self.after_seqs.append(after)
        ws.send(json.dumps({"type": "run", "run": self._before("pending", "waiting for a runner")}))
        ws.send(json.dumps({"type": "run", "run": self._before("running", "")}))
        pending = [line for line in self.lines if line[0] > after]
        if len(self.after_seqs) <= self.drops:
            self._send(ws, pending[: self.drop_after])
            ws.close(1011)
            return
        self._send(ws, pending)
        ws.send(json.dumps({"type": "run", "run": self.final}))
        for _ in ws:
            pass

    def _before(self, status: str, reason: str) -> dict[str, Any]:
        """The final run's jobs as they were earlier: all in ``status``."""
        jobs = [{**job, "status": status, "status_reason": "", "exit_code": None} for job in self.final["jobs"]]
        return {**self.final, "status": status, "status_reason": reason, "exit_code": None, "jobs": jobs}

    def _send(self, ws: ServerConnection, lines: list[list[Any]]) -> None:
        for start in range(0, len(lines), 5000):
            for job, batch in itertools.groupby(lines[start : start + 5000], key=self.job_of):
                for run in _consecutive(list(batch)):
                    ws.send(json.dumps(logs_frame(job, run)))


@contextmanager
def serving(socket: FakeRunSocket) -> Iterator[str]:
    """Run the websocket server in a thread; yields its http:// base URL."""
    with serve(socket.handle, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
        finally:
            server.shutdown()
            thread.join(5)


def rest_client(url: str, handler: Callable[[httpx.Request], httpx.Response]) -> Client:
    return Client(url, TOKEN, "ws1", transport=httpx.MockTransport(handler))


def lines_of(n: int, *, stream: str = "o") -> list[list[Any]]:
    return [[i, 1.0, stream, f"line {i}"] for i in range(1, n + 1)]


def _consecutive(lines: list[list[Any]]) -> list[list[list[Any]]]:
    """``lines`` ([seq, …] each) cut where a seq does not follow the one before."""
    runs: list[list[list[Any]]] = []
    for line in lines:
        if runs and line[0] == runs[-1][-1][0] + 1:
            runs[-1].append(line)
        else:
            runs.append([line])
    return runs

"""A real HTTP server with the runner's artifact endpoints (docs/API.md,
"Runner endpoints": begin, urls, complete, kept) and a PUT target for the files,
that answers 503 the way a server in an outage does: for the first
``fail_first`` upload requests, or until ``fail_until`` (time.monotonic()).

Run it in a thread (``FlakyStorage.start()``); ``stored`` holds the bytes
of every file PUT, ``completed`` the artifacts completed."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FlakyStorage:
    def __init__(self) -> None:
        self.fail_first = 0
        self.fail_until = 0.0
        self.refused = 0  # requests answered 503
        self.stored: dict[str, bytes] = {}
        self.completed: list[str] = []
        self.manifests: dict[str, list[dict[str, Any]]] = {}
        self.kept_reports: list[tuple[str, dict[str, Any]]] = []  # (path?query, body) of POST …/kept/
        self.authorizations: list[str] = []  # the Authorization header of every POST
        self.refuse_kept = 0  # answer this many more POST …/kept/ with 503
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def api_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/api/v1"

    def fail_for(self, seconds: float) -> None:
        self.fail_until = time.monotonic() + seconds

    def start(self) -> FlakyStorage:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def failing(self) -> bool:
        with self._lock:
            if self.fail_first > 0:
                self.fail_first -= 1
            elif time.monotonic() >= self.fail_until:
                return False
            self.refused += 1
            return True


def _handler(state: FlakyStorage) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.authorizations.append(self.headers.get("Authorization", ""))
            if state.failing():
                return self._json(503, {"message": "Service unavailable (the test's outage).", "extra": {}})
            path = self.path.split("?")[0]
            if path.endswith("/kept/"):
                if state.refuse_kept > 0:
                    state.refuse_kept -= 1
                    return self._json(503, {"message": "Service unavailable (the test's outage).", "extra": {}})
                state.kept_reports.append((self.path, json.loads(raw or b"{}")))
                return self._json(204, {})
            if path.endswith("/complete/"):
                artifact = path.rstrip("/").split("/")[-2]
                missing = [
                    f["path"] for f in state.manifests[artifact] if f"{artifact}/{f['path']}" not in state.stored
                ]
                if missing:
                    return self._json(400, {"message": f"missing {missing}", "extra": {}})
                state.completed.append(artifact)
                return self._json(200, {"id": artifact, "status": "complete"})
            body = json.loads(raw or b"{}")
            if path.endswith("/urls/"):
                artifact = path.rstrip("/").split("/")[-2]
                target = {"number": 0, "url": f"/put/{artifact}/{body['path']}", "headers": {}, "seconds": 3600}
                return self._json(200, {"path": body["path"], "targets": [target]})
            artifact = f"a{len(state.manifests) + 1}"
            state.manifests[artifact] = body["files"]
            uploads = [
                {"path": f["path"], "url": f"/put/{artifact}/{f['path']}", "headers": {}, "part_size": 0, "parts": 0}
                for f in body["files"]
            ]
            self._json(201, {"id": artifact, "uploads": uploads})

        def do_PUT(self) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if state.failing():
                return self._json(503, {"message": "Service unavailable (the test's outage).", "extra": {}})
            key = self.path.split("?")[0].removeprefix("/put/")
            artifact, _, name = key.partition("/")
            expected = {f["path"]: f["sha256"] for f in state.manifests.get(artifact, [])}
            if expected.get(name) != hashlib.sha256(data).hexdigest():
                return self._json(400, {"message": "checksum", "extra": {}})
            state.stored[key] = data
            self._json(201, {"size": len(data)})

        def _json(self, status: int, body: dict[str, Any]) -> None:
            out = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    return Handler

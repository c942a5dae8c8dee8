"""An EC2 instance metadata service a test controls (IMDSv2 only).

``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``
(1..21600) gives a session token; every ``GET /latest/meta-data/…`` must
carry one that is still valid (``X-aws-ec2-metadata-token``), else 401 — a
v1 read (no token) is refused and recorded; so must ``GET /latest/dynamic/…``
(the instance identity document and its ``rsa2048`` signature, by the test
key: tests/support/iid.py). The test sets what is served: ``values``
(instance-id, placement/…, dynamic/…), ``notice(action, at)`` for
``spot/instance-action``, ``rebalance(at)`` for
``events/recommendations/rebalance``; ``expire_tokens()`` makes every token
issued so far invalid, as IMDS does when a TTL runs out.

    with ImdsServer(instance_id="i-1") as imds:
        env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = imds.url
        imds.notice("terminate", time.time() + 25)
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support import iid

NOTICE = "spot/instance-action"
REBALANCE = "events/recommendations/rebalance"
MAX_TTL = 21600


@dataclass(frozen=True)
class Request:
    at: float  # unix time
    method: str
    path: str  # without /latest/meta-data/ for reads
    token: str  # the token sent ("" for none)
    status: int


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ImdsServer:
    def __init__(
        self,
        *,
        instance_id: str = "i-0123456789abcdef0",
        instance_type: str = "g5.xlarge",
        region: str = "us-east-1",
        zone: str = "us-east-1a",
    ) -> None:
        document, signature = iid.signed(instance_id=instance_id, region=region, instance_type=instance_type, zone=zone)
        self.values: dict[str, str] = {
            "instance-id": instance_id,
            "instance-type": instance_type,
            "placement/region": region,
            "placement/availability-zone": zone,
            "dynamic/instance-identity/document": document,
            "dynamic/instance-identity/rsa2048": signature,
        }
        self.requests: list[Request] = []
        self._tokens: dict[str, float] = {}  # token → monotonic expiry
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # ------------------------------------------------------------ control

    def notice(self, action: str, at: float) -> None:
        """From now on ``spot/instance-action`` says the machine is reclaimed at ``at``."""
        self.values[NOTICE] = json.dumps({"action": action, "time": iso(at)})

    def rebalance(self, at: float | None = None) -> None:
        self.values[REBALANCE] = json.dumps({"noticeTime": iso(at if at is not None else time.time())})

    def expire_tokens(self) -> None:
        with self._lock:
            self._tokens.clear()

    def reads(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path == path]

    def without_token(self) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and not r.token]

    def puts(self) -> list[Request]:
        return [r for r in self.requests if r.method == "PUT"]

    # ------------------------------------------------------------ lifecycle

    def start(self) -> ImdsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ImdsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ serving

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                raw = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                ttl = int(raw) if raw.isdigit() else 0
                if self.path != "/latest/api/token" or not 1 <= ttl <= MAX_TTL:
                    self._answer("PUT", self.path, "", 400, "")
                    return
                token = secrets.token_urlsafe(16)
                with outer._lock:
                    outer._tokens[token] = time.monotonic() + ttl
                self._answer("PUT", self.path, "", 200, token)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                path = path.removeprefix("/latest/meta-data/" if path.startswith("/latest/meta-data/") else "/latest/")
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                with outer._lock:
                    valid = outer._tokens.get(token, 0.0) > time.monotonic()
                if not valid:
                    self._answer("GET", path, token, 401, "")
                    return
                value = outer.values.get(path)
                self._answer("GET", path, token, 200 if value is not None else 404, value or "")

            def _answer(self, method: str, path: str, token: str, status: int, body: str) -> None:
                outer.requests.append(Request(time.time(), method, path, token, status))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

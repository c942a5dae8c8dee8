"""A private git remote over HTTP: real ``git http-backend`` (CGI) behind a
small threaded HTTP server on 127.0.0.1 that demands HTTP Basic auth.

    server = GitHttpServer(root, username="ci", password="s3cret-token").start()
    url = server.publish(path_to_a_repo, "models.git")   # a bare copy under root
    ...
    server.close()

Every request is recorded in ``requests`` (method, path, whether it carried
the right credentials, the raw Authorization header) so a test can check
what the client sent. Requests without the right credentials get 401 with a
``WWW-Authenticate: Basic`` challenge, as GitHub or GitLab answer.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

CGI_TIMEOUT = 60


@dataclass
class Seen:
    method: str
    path: str
    authorized: bool
    authorization: str


@dataclass
class GitHttpServer:
    root: Path  # bare repositories live here
    username: str
    password: str
    requests: list[Seen] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> GitHttpServer:
        self.root.mkdir(parents=True, exist_ok=True)
        owner = self

        class Handler(_CgiHandler):
            server_owner = owner

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def publish(self, repo: Path, name: str) -> str:
        """A bare clone of ``repo`` served as ``<url>/<name>``; returns the clone URL."""
        target = self.root / name
        if target.exists():
            shutil.rmtree(target)
        subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(target)], check=True, capture_output=True)
        return f"{self.url}/{name}"

    def expected_header(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


class _CgiHandler(BaseHTTPRequestHandler):
    server_owner: GitHttpServer
    protocol_version = "HTTP/1.0"  # one request per connection: no keep-alive bookkeeping

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def _serve(self) -> None:
        owner = self.server_owner
        header = self.headers.get("Authorization", "")
        ok = header == owner.expected_header()
        parts = urlsplit(self.path)
        owner.requests.append(Seen(self.command, parts.path, ok, header))
        body = self._body()
        if not ok:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        env = {
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "GIT_PROJECT_ROOT": str(owner.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": parts.path,
            "QUERY_STRING": parts.query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": owner.username,
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "HTTP_GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
        }
        done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=CGI_TIMEOUT)
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = done.stdout.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from trainyard_runner import artifacts, retry
from trainyard_runner.artifacts import ArtifactError, manifest, upload_artifacts


class FakeApi:
    """The two runner artifact endpoints of docs/API.md plus a PUT target."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.puts: dict[str, bytes] = {}
        self.put_auth: list[str | None] = []
        self.completed: list[str] = []
        self.auth: list[str | None] = []
        self.unavailable = 0  # answer this many more requests with 503, as a server in an outage would


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, str]]:
    state = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if state.unavailable:
                state.unavailable -= 1
                return self._json(503, {"message": "down"})
            state.auth.append(self.headers.get("Authorization"))
            if self.path.endswith("/complete/?attempt=1"):
                state.completed.append(self.path)
                return self._json(200, {})
            state.created.append(body)
            n = len(state.created)
            uploads = [{"path": f["path"], "url": f"/put/{n}/{f['path']}?sig=x"} for f in body["files"]]
            self._json(201, {"id": f"a{n}", "uploads": uploads})

        def do_PUT(self) -> None:
            state.put_auth.append(self.headers.get("Authorization"))
            state.puts[self.path.split("?")[0]] = self.rfile.read(int(self.headers["Content-Length"]))
            self._json(200, {})

        def _json(self, status: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}/api/v1"
    server.shutdown()


def test_uploads_every_file_with_its_manifest_then_completes(tmp_path: Path, api: tuple[FakeApi, str]) -> None:
    state, url = api
    (tmp_path / "model" / "sub").mkdir(parents=True)
    (tmp_path / "model" / "w.bin").write_bytes(b"\x00\x01" * 1000)
    (tmp_path / "model" / "sub" / "cfg.json").write_text("{}")
    (tmp_path / "model" / "empty").write_bytes(b"")

    upload_artifacts(["./model"], work=tmp_path, job="j1", attempt=1, api_url=url, token="tok")

    assert state.created == [
        {
            "path": "./model",
            "files": [
                {"path": "empty", "size": 0, "sha256": hashlib.sha256(b"").hexdigest()},
                {"path": "sub/cfg.json", "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
                {"path": "w.bin", "size": 2000, "sha256": hashlib.sha256(b"\x00\x01" * 1000).hexdigest()},
            ],
        }
    ]
    assert state.puts == {"/put/1/empty": b"", "/put/1/sub/cfg.json": b"{}", "/put/1/w.bin": b"\x00\x01" * 1000}
    assert state.completed == ["/api/v1/runner/jobs/j1/artifacts/a1/complete/?attempt=1"]
    assert set(state.auth) == {"Bearer tok"}
    assert set(state.put_auth) == {"Bearer tok"}  # same origin as the API: our own storage


def test_a_missing_artifact_path_fails_before_anything_is_uploaded(tmp_path: Path, api: tuple[FakeApi, str]) -> None:
    state, url = api
    (tmp_path / "ok").write_text("1")
    with pytest.raises(ArtifactError) as e:
        upload_artifacts(["./ok", "./x"], work=tmp_path, job="j1", attempt=1, api_url=url, token="tok")
    assert str(e.value) == "artifact path ./x was not created by the job"
    assert state.created == []


def test_a_single_file_artifact_is_its_own_manifest(tmp_path: Path) -> None:
    (tmp_path / "m.pt").write_bytes(b"abc")
    assert [(e.path, e.size) for e in manifest(tmp_path / "m.pt")] == [("m.pt", 3)]


def test_an_artifact_path_outside_the_work_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    with pytest.raises(ArtifactError, match="outside the working directory"):
        upload_artifacts(["../"], work=tmp_path / "work", job="j", attempt=1, api_url="http://127.0.0.1:1", token="t")


def test_an_upload_rides_out_a_server_outage(
    tmp_path: Path, api: tuple[FakeApi, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = api
    pauses: list[float] = []
    monkeypatch.setattr(artifacts.time, "sleep", pauses.append)
    (tmp_path / "m.pt").write_bytes(b"abc")
    state.unavailable = 6

    upload_artifacts(["./m.pt"], work=tmp_path, job="j1", attempt=1, api_url=url, token="tok")

    # Capped exponential backoff with jitter: each pause at most 1, 2, 4, … s (and at least 0.5 s).
    assert len(pauses) == 6
    assert all(0.5 <= pause <= 2**i for i, pause in enumerate(pauses))
    assert state.puts == {"/put/1/m.pt": b"abc"}
    assert state.completed == ["/api/v1/runner/jobs/j1/artifacts/a1/complete/?attempt=1"]


def test_an_upload_gives_up_when_the_server_stays_away(
    tmp_path: Path, api: tuple[FakeApi, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = api
    monkeypatch.setattr(retry, "RETRY_SECONDS", 0.5)
    (tmp_path / "m.pt").write_bytes(b"abc")
    state.unavailable = 1000

    with pytest.raises(ArtifactError, match=r"^artifact upload failed: POST .*/artifacts/: HTTP 503"):
        upload_artifacts(["./m.pt"], work=tmp_path, job="j1", attempt=1, api_url=url, token="tok")
    assert state.created == []


def test_an_absolute_artifact_path_is_uploaded_from_there_only_where_the_runner_allows_it(tmp_path: Path) -> None:
    from trainyard_runner.artifacts import ArtifactError, _resolve

    env_dir = tmp_path / "conda-env"
    env_dir.mkdir()
    assert _resolve(tmp_path / "work", str(env_dir), absolute_ok=True) == env_dir.resolve()
    with pytest.raises(ArtifactError, match=r"this runner takes no absolute paths \(the local backend"):
        _resolve(tmp_path / "work", str(env_dir), absolute_ok=False)


def test_a_refusal_shows_the_servers_message_not_its_json(tmp_path: Path) -> None:
    """A storage quota's 413 reaches the job's reason as the sentence the server wrote."""
    message = "This workspace's storage quota is full: 9.0 GiB of 10.0 GiB used, 2.0 GiB more asked for."

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            raw = json.dumps({"message": message, "extra": {"used_bytes": 9}}).encode()
            self.send_response(413)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "m.pt").write_bytes(b"abc")
    try:
        with pytest.raises(ArtifactError) as e:
            url = f"http://127.0.0.1:{server.server_address[1]}/api/v1"
            upload_artifacts(["./m.pt"], work=tmp_path, job="j1", attempt=1, api_url=url, token="tok")
    finally:
        server.shutdown()
    assert (
        str(e.value)
        == f"artifact upload failed: POST http://127.0.0.1:{server.server_address[1]}/api/v1/runner/jobs/j1/artifacts/: HTTP 413 {message}"
    )

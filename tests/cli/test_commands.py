from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from tests.cli.fakes import TOKEN, FakeRunSocket, lines_of, make_run, rest_client, serving
from trainyard.cli import cli
from trainyard.config import load_config

WS = "/api/v1/workspaces/ws1"


class FakeRest:
    """Records requests; answers from a {(method, path): response} table."""

    def __init__(self, routes: dict[tuple[str, str], httpx.Response]) -> None:
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        if request.url.host == "storage.fake":  # the signed URL never gets the token
            assert "Authorization" not in request.headers
        else:
            assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        return self.routes[(request.method, request.url.path)]


def use(monkeypatch: pytest.MonkeyPatch, url: str, rest: FakeRest) -> None:
    monkeypatch.setattr("trainyard.cli._client", lambda: rest_client(url, rest))


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def submit_routes() -> dict[tuple[str, str], httpx.Response]:
    return {
        ("POST", f"{WS}/blobs/"): httpx.Response(201, json={"id": "blob-1", "size": 10, "sha256": "x"}),
        ("POST", f"{WS}/runs/"): httpx.Response(201, json=make_run("pending")),
    }


def test_run_detached_uploads_the_archive_and_prints_the_name_last(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    rest = FakeRest(submit_routes())
    use(monkeypatch, "http://fake", rest)
    code, out, err = invoke("run", "hello", "-d", "-e", "GREETING=hi")
    assert (code, out, err) == (0, "brave-otter-1\n", "Run brave-otter-1 submitted\n")
    body = json.loads(rest.requests[1].content)
    assert body["workflow"] == "hello" and body["env"] == {"GREETING": "hi"}
    assert body["code"] == {"kind": "archive", "archive_blob": "blob-1"}
    assert body["workflows_file"] == {"path": ".trainyard/workflows.yaml", "text": (tiny_train / ".trainyard/workflows.yaml").read_text()}


def test_run_follows_to_the_end_and_exits_with_the_jobs_code(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    lines = [[1, 1.0, "e", "about to fail"]]
    with serving(FakeRunSocket(lines, final=make_run("failed", last_seq=1, exit_code=3, reason="exit code 3"))) as url:
        use(monkeypatch, url, FakeRest(submit_routes()))
        code, out, err = invoke("run", "fail")
    assert (code, out) == (3, "")
    assert err == "Run brave-otter-1 submitted\n[pending] waiting for a runner\n[running]\nabout to fail\n[failed] exit code 3\n"


def test_run_refuses_an_unsupported_workflow_before_submitting(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    rest = FakeRest({})
    use(monkeypatch, "http://fake", rest)
    code, out, err = invoke("run", "evaluate")
    assert (code, out) == (1, "")
    assert err == ".trainyard/workflows.yaml:35: workflows[3] (evaluate).deps: 'deps' is not supported yet; remove it from workflow 'evaluate' to run it\n"
    assert rest.requests == []


def test_server_workflow_errors_are_printed_one_per_line(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    routes = submit_routes()
    errors = [{"file": ".trainyard/workflows.yaml", "line": 3, "key": "workflows[0] (hello).commands", "message": "nope"}]
    routes[("POST", f"{WS}/runs/")] = httpx.Response(400, json={"message": "invalid workflows file", "extra": {"errors": errors}})
    use(monkeypatch, "http://fake", FakeRest(routes))
    code, _, err = invoke("run", "hello")
    assert code == 1
    assert err == "error: invalid workflows file\n.trainyard/workflows.yaml:3: workflows[0] (hello).commands: nope\n"


def test_without_a_token_the_error_says_how_to_get_one(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    code, _, err = invoke("run", "hello")
    assert (code, err) == (1, "error: no API token: set TRAINYARD_TOKEN, or run `trainyard login --url URL --token TOKEN`\n")


def test_unreachable_server_is_one_clear_line(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRAINYARD_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TRAINYARD_TOKEN", TOKEN)
    monkeypatch.setenv("TRAINYARD_WORKSPACE", "ws1")
    code, _, err = invoke("ps")
    assert (code, err) == (1, "error: cannot reach Trainyard at http://127.0.0.1:9: is the server running (make run)?\n")


def test_ps_plain_table_with_reason_and_json(monkeypatch: pytest.MonkeyPatch):
    runs = [make_run("pending", reason="waiting for a runner: no runner has 8 CPUs free right now, try later", name="a-1"), make_run("succeeded", name="b-2")]
    rest = FakeRest({("GET", f"{WS}/runs/"): httpx.Response(200, json={"count": 2, "next": None, "previous": None, "results": runs})})
    use(monkeypatch, "http://fake", rest)
    code, out, _ = invoke("ps")
    assert code == 0
    header, first, second = out.splitlines()
    assert header.split() == ["NAME", "WORKFLOW", "STATUS", "SUBMITTED", "DURATION", "REASON"]
    assert first.split()[:3] == ["a-1", "hello", "pending"] and first.endswith("waiting for a runner: no runner has 8 CPUs free…")
    assert second.split()[:3] == ["b-2", "hello", "succeeded"] and "3s" in second
    code, out, _ = invoke("ps", "--json")
    assert json.loads(out) == runs


def test_logs_pages_through_every_line(monkeypatch: pytest.MonkeyPatch):
    pages = iter([
        {"job": "job-1", "lines": [{"seq": 1, "ts": 1.0, "stream": "o", "text": "a"}, {"seq": 2, "ts": 1.0, "stream": "e", "text": "b"}], "has_more": True},
        {"job": "job-1", "lines": [{"seq": 3, "ts": 1.0, "stream": "o", "text": "c"}], "has_more": False},
    ])  # fmt: skip
    seen: list[str] = []

    def rest(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/logs/"):
            seen.append(request.url.params["after_seq"])
            assert request.url.params["limit"] == "10000"
            return httpx.Response(200, json=next(pages))
        return httpx.Response(200, json=make_run("succeeded", last_seq=3))

    monkeypatch.setattr("trainyard.cli._client", lambda: rest_client("http://fake", rest))
    code, out, err = invoke("logs", "brave-otter-1")
    assert (code, out, err, seen) == (0, "a\nc\n", "b\n", ["0", "2"])


def artifact_routes(content: bytes, *, sha: str | None = None, path: str = "./base_model") -> dict[tuple[str, str], httpx.Response]:
    manifest = [{"id": "art-1", "job": "job-1", "path": path, "status": "complete", "total_size": len(content), "files": [{"path": "weights.json", "size": len(content), "sha256": sha or hashlib.sha256(content).hexdigest()}]}]
    return {
        ("GET", f"{WS}/runs/brave-otter-1/artifacts/"): httpx.Response(200, json=manifest),
        ("GET", f"{WS}/artifacts/art-1/files/weights.json"): httpx.Response(302, headers={"Location": "http://storage.fake/signed/abc"}),
        ("GET", "/signed/abc"): httpx.Response(200, content=content),
    }


def test_artifacts_download_follows_the_redirect_and_checks_the_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    use(monkeypatch, "http://fake", FakeRest(artifact_routes(b'{"w": 0.0}')))
    code, _, err = invoke("artifacts", "download", "brave-otter-1", "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert (tmp_path / "out" / "base_model" / "weights.json").read_bytes() == b'{"w": 0.0}'


def test_artifacts_download_refuses_a_digest_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    use(monkeypatch, "http://fake", FakeRest(artifact_routes(b"tampered", sha="0" * 64)))
    code, _, err = invoke("artifacts", "download", "brave-otter-1", "-o", str(tmp_path / "out"))
    assert code == 1 and "but the manifest says 8 bytes with sha256 " + "0" * 64 in err
    assert not (tmp_path / "out" / "base_model" / "weights.json").exists()


def test_artifacts_download_refuses_paths_that_escape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    use(monkeypatch, "http://fake", FakeRest(artifact_routes(b"x", path="../../etc")))
    code, _, err = invoke("artifacts", "download", "brave-otter-1", "-o", str(tmp_path / "out"))
    assert (code, err) == (1, "error: refusing artifact file ../../etc/weights.json: its path leaves the output directory\n")


def test_login_checks_the_token_and_saves_it_private(monkeypatch: pytest.MonkeyPatch):
    rest = FakeRest({("GET", "/api/v1/me/"): httpx.Response(200, json={"username": "alice", "default_workspace": "alice", "workspaces": []})})
    real_client = __import__("trainyard.api", fromlist=["Client"]).Client
    monkeypatch.setattr("trainyard.cli.Client", lambda url, token, ws: real_client(url, token, ws, transport=httpx.MockTransport(rest)))
    code, _, err = invoke("login", "--url", "http://srv:8000/", "--token", TOKEN)
    assert code == 0 and err.startswith("Logged in to http://srv:8000 as alice (workspace alice)")
    config = load_config()
    assert (config.url, config.token, config.workspace) == ("http://srv:8000", TOKEN, None)
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "trainyard" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    monkeypatch.setenv("TRAINYARD_URL", "http://env:1")
    assert load_config().url == "http://env:1"


def test_ctrl_c_while_following_detaches_with_130(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    use(monkeypatch, "http://fake", FakeRest(submit_routes()))

    def interrupted(self: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("trainyard.follow.Follower.follow", interrupted)
    code, _, err = invoke("run", "hello")
    assert code == 130
    assert err.endswith("\ndetached; the run continues — trainyard stop brave-otter-1 to stop it\n")

from __future__ import annotations

import hashlib
import json
import os
import stat
import textwrap
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from trainyard.api import _prefixed
from trainyard.cli import cli
from trainyard.code import Workspace, file_sha256, make_archive
from trainyard.config import load_config

from tests.cli.fakes import TOKEN, WS, FakeRest, FakeRunSocket, invoke, make_job, make_run, rest_client, serving, use


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
    sent = "Sending from this shell and -e: GREETING (kept encrypted, masked in logs)\n"
    assert (code, out, err) == (
        0,
        "brave-otter-1\n",
        sent + "Run brave-otter-1 submitted\nView: http://fake/w/ws1/runs/brave-otter-1\n",
    )
    body = json.loads(rest.requests[1].content)
    assert body["workflow"] == "hello" and body["env"] == {"GREETING": "hi"}
    assert {k: v for k, v in body["code"].items() if k != "patch_files"} == {
        "kind": "archive",
        "archive_blob": "blob-1",
    }
    assert "train.py" in body["code"]["patch_files"]  # each file's digest, for the cache decision's file names
    assert body["workflows_file"] == {
        "path": ".trainyard/workflows.yaml",
        "text": (tiny_train / ".trainyard/workflows.yaml").read_text(),
    }


def test_run_sends_the_placement_options_and_prints_the_plan_table(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    routes = submit_routes()
    offer = {"offers": 3, "backend": "fake", "instance_type": "fake-small", "region": "r1", "spot": True}
    plan = [{"job": "hello", "offer": {**offer, "price_per_hour": 0.05}}]
    routes[("POST", f"{WS}/runs/")] = httpx.Response(201, json={**make_run("pending"), "plan": plan})
    rest = FakeRest(routes)
    use(monkeypatch, "http://fake", rest)
    args = ["--backend", "fake,local", "--backend", "aws", "--region", "r1", "--spot-policy", "auto"]
    code, out, err = invoke("run", "hello", "-d", *args, "--max-price", "0.5")
    assert (code, out) == (0, "brave-otter-1\n")
    assert err == (
        "Run brave-otter-1 submitted\n"
        "View: http://fake/w/ws1/runs/brave-otter-1\n"
        "JOB    BACKEND  REGION  INSTANCE    GPU  SPOT  PRICE      MAX COST  OFFERS\n"
        "hello  fake     r1      fake-small  -    yes   $0.0500/h  -         3\n"
    )
    body = json.loads(rest.requests[1].content)
    assert body["placement"] == {
        "backends": ["fake", "local", "aws"],
        "regions": ["r1"],
        "spot_policy": "auto",
        "max_price": 0.5,
    }


def test_run_sends_its_budget_options_and_prints_the_estimate_and_the_wait(
    tiny_train: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tiny_train)
    routes = submit_routes()
    offer = {"offers": 3, "backend": "fake", "instance_type": "fake-small", "region": "r1", "spot": False}
    plan = [{"job": "hello", "offer": {**offer, "price_per_hour": 3.0}, "max_cost": "12.0000"}]
    waiting = "waiting for budget: workspace budget: $20.00 this month, $0.00 spent, this run may cost up to $12.00"
    answer = {**make_run("pending", reason=waiting), "plan": plan, "estimate": "12.0000"}
    routes[("POST", f"{WS}/runs/")] = httpx.Response(201, json=answer)
    rest = FakeRest(routes)
    use(monkeypatch, "http://fake", rest)

    code, out, err = invoke("run", "hello", "-d", "--max-cost", "15", "--queue", "--override-budget")

    assert (code, out) == (0, "brave-otter-1\n")
    assert err.splitlines()[1:] == [
        "View: http://fake/w/ws1/runs/brave-otter-1",
        "JOB    BACKEND  REGION  INSTANCE    GPU  SPOT  PRICE      MAX COST  OFFERS",
        "hello  fake     r1      fake-small  -    no    $3.0000/h  $12.00    3",
        "Estimate: at most $12.00 (each job's cheapest offer × its max_duration)",
        f"Its jobs are {waiting}",
    ]
    body = json.loads(rest.requests[1].content)
    assert (body["max_cost"], body["queue"], body["budget_override"]) == ("15", True, True)


def test_run_without_budget_options_sends_none(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    rest = FakeRest(submit_routes())
    use(monkeypatch, "http://fake", rest)
    assert invoke("run", "hello", "-d")[0] == 0
    body = json.loads(rest.requests[1].content)
    assert not {"max_cost", "queue", "budget_override"} & set(body)


def test_run_refuses_an_unknown_backend_option(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    rest = FakeRest({})
    use(monkeypatch, "http://fake", rest)
    code, _, err = invoke("run", "hello", "--backend", "asw")
    assert code == 2
    assert (
        "Invalid value for --backend: unknown backend 'asw'; known backends: aws, kubernetes, local, fake, self-hosted"
        in err
    )
    assert rest.requests == []


def test_run_follows_to_the_end_and_exits_with_the_jobs_code(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    lines = [[1, 1.0, "e", "about to fail"]]
    with serving(FakeRunSocket(lines, final=make_run("failed", last_seq=1, exit_code=3, reason="exit code 3"))) as url:
        use(monkeypatch, url, FakeRest(submit_routes()))
        code, out, err = invoke("run", "fail")
    assert (code, out) == (3, "")
    assert err == (
        f"Run brave-otter-1 submitted\nView: {url}/w/ws1/runs/brave-otter-1\n"
        "[pending] waiting for a runner\n[running]\nabout to fail\n[failed] exit code 3\n"
    )


def test_run_refuses_a_bad_placement_value_before_submitting(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    path = tiny_train / ".trainyard" / "workflows.yaml"
    text = path.read_text()
    line = text.count("\n") + 4
    path.write_text(text + "  - name: flaky\n    provider: bash\n    commands: [exit 1]\n    max_duration: soon\n")
    rest = FakeRest({})
    use(monkeypatch, "http://fake", rest)
    code, out, err = invoke("run", "flaky")
    assert (code, out) == (1, "")
    assert (
        err
        == f".trainyard/workflows.yaml:{line}: workflows[6] (flaky).max_duration: expected a duration such as 30m, 2h or 1d (or off), got 'soon'\n"
    )
    assert rest.requests == []


def test_server_workflow_errors_are_printed_one_per_line(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    routes = submit_routes()
    errors = [
        {"file": ".trainyard/workflows.yaml", "line": 3, "key": "workflows[0] (hello).commands", "message": "nope"}
    ]
    routes[("POST", f"{WS}/runs/")] = httpx.Response(
        400, json={"message": "invalid workflows file", "extra": {"errors": errors}}
    )
    use(monkeypatch, "http://fake", FakeRest(routes))
    code, _, err = invoke("run", "hello")
    assert code == 1
    assert err == "error: invalid workflows file\n.trainyard/workflows.yaml:3: workflows[0] (hello).commands: nope\n"


def test_without_a_token_the_error_says_how_to_get_one(tiny_train: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tiny_train)
    code, _, err = invoke("run", "hello")
    assert (code, err) == (
        1,
        "error: no API token: run `trainyard login` (or set TRAINYARD_TOKEN)\n",
    )


def test_unreachable_server_is_one_clear_line(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRAINYARD_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TRAINYARD_TOKEN", TOKEN)
    monkeypatch.setenv("TRAINYARD_WORKSPACE", "ws1")
    code, _, err = invoke("ps")
    assert (code, err) == (
        1,
        "error: cannot reach Trainyard at http://127.0.0.1:9: is the server running (make run)?\n",
    )


def test_ps_plain_table_with_reason_and_json(monkeypatch: pytest.MonkeyPatch):
    runs = [
        make_run("pending", reason="waiting for a runner: no runner has 8 CPUs free right now, try later", name="a-1"),
        make_run("succeeded", name="b-2"),
    ]
    rest = FakeRest(
        {
            ("GET", f"{WS}/runs/"): httpx.Response(
                200, json={"count": 2, "next": None, "previous": None, "results": runs}
            )
        }
    )
    use(monkeypatch, "http://fake", rest)
    code, out, _ = invoke("ps")
    assert code == 0
    header, first, second = out.splitlines()
    assert header.split() == ["NAME", "WORKFLOW", "STATUS", "SUBMITTED", "DURATION", "COST", "REASON"]
    assert first.split()[:3] == ["a-1", "hello", "pending"] and first.endswith(
        "waiting for a runner: no runner has 8 CPUs free…"
    )
    assert second.split()[:3] == ["b-2", "hello", "succeeded"] and "3s" in second
    code, out, _ = invoke("ps", "--json")
    assert json.loads(out) == runs


def test_logs_of_a_live_job_pages_through_every_line(monkeypatch: pytest.MonkeyPatch):
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
        return httpx.Response(200, json=make_run("running", last_seq=3))

    monkeypatch.setattr("trainyard.commands.common.client", lambda: rest_client("http://fake", rest))
    code, out, err = invoke("logs", "brave-otter-1")
    assert (code, out, err, seen) == (0, "a\nc\n", "b\n", ["0", "2"])


def test_logs_of_a_finished_job_is_its_raw_log(monkeypatch: pytest.MonkeyPatch):
    def rest(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/logs/raw"):
            return httpx.Response(200, content=b"a\nb\xef\xbf\xbd\rc\n", headers={"content-type": "text/plain"})
        assert not request.url.path.endswith("/logs/")
        return httpx.Response(200, json=make_run("succeeded", last_seq=2))

    monkeypatch.setattr("trainyard.commands.common.client", lambda: rest_client("http://fake", rest))
    code, out, err = invoke("logs", "brave-otter-1")
    assert (code, out, err) == (0, "a\nb\ufffd\rc\n", "")


def test_raw_lines_get_the_job_prefix_however_the_body_is_cut():
    body = b"one\ntwo\nthree\n"
    for cut in range(1, len(body)):
        start = True
        out = b""
        for chunk in (body[:cut], body[cut:]):
            piece, start = _prefixed(chunk, b"[train] ", start)
            out += piece
        assert out == b"[train] one\n[train] two\n[train] three\n", cut


def artifact_routes(
    content: bytes, *, sha: str | None = None, path: str = "./base_model"
) -> dict[tuple[str, str], httpx.Response]:
    manifest = [
        {
            "id": "art-1",
            "job": "job-1",
            "path": path,
            "status": "complete",
            "total_size": len(content),
            "files": [
                {"path": "weights.json", "size": len(content), "sha256": sha or hashlib.sha256(content).hexdigest()}
            ],
        }
    ]
    return {
        ("GET", f"{WS}/runs/brave-otter-1/artifacts/"): httpx.Response(200, json=manifest),
        ("GET", f"{WS}/artifacts/art-1/files/weights.json"): httpx.Response(
            302, headers={"Location": "http://storage.fake/signed/abc"}
        ),
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
    assert (code, err) == (
        1,
        "error: refusing artifact file ../../etc/weights.json: its path leaves the output directory\n",
    )


def test_login_checks_the_token_and_saves_it_private(monkeypatch: pytest.MonkeyPatch):
    rest = FakeRest(
        {
            ("GET", "/api/v1/me/"): httpx.Response(
                200, json={"username": "alice", "default_workspace": "alice", "workspaces": []}
            )
        }
    )
    real_client = __import__("trainyard.api", fromlist=["Client"]).Client
    monkeypatch.setattr(
        "trainyard.commands.login.Client",
        lambda url, token, ws: real_client(url, token, ws, transport=httpx.MockTransport(rest)),
    )
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


# ------------------------------------------------------------ runs of several jobs

PIPELINE = """\
workflows:
  - name: download-base-model
    provider: bash
    commands: [python download.py]
    artifacts: [./base_model]
  - name: finetune-model
    provider: bash
    commands: [python train.py]
    deps: [{workflow: download-base-model}]
    artifacts: [./checkpoint]
    resources: {cpu: 1, memory: 256MB}
  - name: loop
    provider: bash
    commands: [x]
    deps: [{workflow: loop}]
"""

PLAN = {
    "workflow": "finetune-model",
    "jobs": [
        {"name": "download-base-model", "workflow": "download-base-model", "provider": "bash", "needs": [], "after_running": [],
         "resources": {"cpu": None, "memory_bytes": None, "gpu_count": 0, "gpu_name": None}, "inputs": [],
         "cache": {"run": "brave-otter-3", "job": "8c1f"}, "commands": ["python download.py"]},
        {"name": "finetune-model", "workflow": "finetune-model", "provider": "bash", "needs": ["download-base-model"], "after_running": [],
         "resources": {"cpu": 1, "memory_bytes": 256 * 2**20, "gpu_count": 1, "gpu_name": "V100"},
         "inputs": [{"path": "./base_model", "from": "job download-base-model"}], "cache": None, "commands": ["python train.py"]},
    ],
}  # fmt: skip


@pytest.fixture
def pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repo (not git) with a two-workflow pipeline, as the cwd."""
    root = tmp_path / "pipeline"
    (root / ".trainyard").mkdir(parents=True)
    (root / ".trainyard" / "workflows.yaml").write_text(PIPELINE)
    (root / "train.py").write_text("print('train')\n")
    monkeypatch.chdir(root)
    return root


def test_dry_run_sends_the_archive_digest_prints_the_plan_and_submits_nothing(
    pipeline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    rest = FakeRest({("POST", f"{WS}/runs/plan/"): httpx.Response(200, json=PLAN)})
    use(monkeypatch, "http://fake", rest)
    code, out, err = invoke("run", "finetune-model", "-e", "STEPS=50", "--dry-run")
    assert (code, err) == (
        0,
        "Sending from this shell and -e: STEPS (kept encrypted, masked in logs)\nNothing was submitted.\n",
    )
    assert out == textwrap.dedent("""\
        Plan for finetune-model: 2 jobs, 1 cached

        1. download-base-model (bash)
           resources: any
           cache: reused from brave-otter-3 (cached)

        2. finetune-model (bash)
           needs: download-base-model
           input: ./base_model from job download-base-model
           resources: cpu 1, memory 256.0 MiB, gpu 1x V100
           commands:
             python train.py
        """)
    [request] = rest.requests  # no blob upload, no run
    make_archive(Workspace(pipeline, False), tmp_path / "expected.tar.gz")
    body = json.loads(request.content)
    assert {k: v for k, v in body["code"].items() if k != "patch_files"} == {
        "kind": "archive",
        "archive_sha256": file_sha256(tmp_path / "expected.tar.gz"),
    }
    assert "train.py" in body["code"]["patch_files"]
    assert (body["workflow"], body["env"], body["no_cache"]) == ("finetune-model", {"STEPS": "50"}, False)


def test_run_no_cache_is_sent_and_the_jobs_are_named(pipeline: Path, monkeypatch: pytest.MonkeyPatch):
    rest = FakeRest(submit_routes())
    use(monkeypatch, "http://fake", rest)
    code, out, err = invoke("run", "finetune-model", "--no-cache", "-d")
    assert (code, out, err) == (
        0,
        "brave-otter-1\n",
        "Run brave-otter-1 submitted (2 jobs: download-base-model, finetune-model)\nView: http://fake/w/ws1/runs/brave-otter-1\n",
    )
    assert json.loads(rest.requests[1].content)["no_cache"] is True


def test_a_dependency_cycle_is_refused_before_anything_is_uploaded(pipeline: Path, monkeypatch: pytest.MonkeyPatch):
    rest = FakeRest({})
    use(monkeypatch, "http://fake", rest)
    code, _, err = invoke("run", "loop")
    assert (code, err, rest.requests) == (
        1,
        ".trainyard/workflows.yaml:15: workflows[2] (loop).deps: a cycle: loop → loop\n",
        [],
    )


EXPORTS = [
    {"job_name": "download-base-model", "path": "./base_model", "destination": "s3://acme-models/brave-otter-4/",
     "status": "done", "error": ""},
    {"job_name": "finetune-model", "path": "./checkpoint", "destination": "s3://acme-models/ckpt/",
     "status": "pending", "error": "S3 refused PutObject: AccessDenied"},
]  # fmt: skip


def test_show_prints_the_dag_with_cache_and_artifacts(monkeypatch: pytest.MonkeyPatch):
    jobs = [
        make_job("succeeded", id="j1", name="download-base-model", cached_from={"run": "brave-otter-3", "job": "old-j"}),
        make_job("running", id="j2", name="finetune-model", needs=["download-base-model"], started_at="2026-01-01T00:00:00Z", inputs=[{"path": "./base_model", "from": "job download-base-model"}]),
        make_job("pending", id="j3", name="evaluate", after_running=["finetune-model"]),
    ]  # fmt: skip
    artifacts = [
        {
            "id": "a1",
            "job": "old-j",
            "path": "./base_model",
            "status": "complete",
            "total_size": 3072,
            "files": [{"path": "w.bin", "size": 1024, "sha256": "x"}, {"path": "v.bin", "size": 2048, "sha256": "y"}],
        }
    ]
    rest = FakeRest(
        {
            ("GET", f"{WS}/runs/brave-otter-4/"): httpx.Response(
                200, json=make_run("running", name="brave-otter-4", jobs=jobs)
            ),
            ("GET", f"{WS}/runs/brave-otter-4/artifacts/"): httpx.Response(200, json=artifacts),
            ("GET", f"{WS}/runs/brave-otter-4/metrics/"): httpx.Response(200, json={"jobs": METRICS_JOBS}),
            ("GET", f"{WS}/runs/brave-otter-4/exports/"): httpx.Response(200, json=EXPORTS),
        }
    )
    use(monkeypatch, "http://fake", rest)
    code, out, _ = invoke("show", "brave-otter-4")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "Run brave-otter-4 of hello: running"
    assert lines[1].split("  ")[0] == "JOB" and [c.strip() for c in lines[1].split("  ") if c.strip()] == [
        "JOB",
        "STATUS",
        "NEEDS",
        "STARTED",
        "DURATION",
        "CACHED FROM",
        "ARTIFACTS",
    ]
    assert [c.strip() for c in lines[2].split("  ") if c.strip()] == [
        "download-base-model",
        "succeeded",
        "-",
        "-",
        "-",
        "brave-otter-3",
        "2 files, 3.0 KiB",
    ]
    assert [c.strip() for c in lines[3].split("  ") if c.strip()][:3] == [
        "finetune-model",
        "running",
        "download-base-model",
    ]
    assert [c.strip() for c in lines[4].split("  ") if c.strip()] == [
        "evaluate",
        "pending",
        "finetune-model (running)",
        "-",
        "-",
        "-",
        "-",
    ]
    assert lines[5:] == [
        "",
        "Metrics (trainyard metrics RUN):",
        "  finetune-model: loss 0.3125 (step 500), cpu 97%, memory 1.5 GiB, gpu0 85% 12.0 GiB/16.0 GiB (3 malformed)",
        "",
        "Inputs:",
        "  finetune-model  ./base_model from job download-base-model",
        "",
        "Exports:",
        "  download-base-model ./base_model → s3://acme-models/brave-otter-4/ (copied)",
        "  finetune-model ./checkpoint → s3://acme-models/ckpt/ (failed: S3 refused PutObject: AccessDenied, retrying)",
    ]


def _last(value: float, step: int | None = None) -> dict[str, object]:
    return {"value": value, "step": step, "t": "2026-01-01T00:10:00Z", "attempt": 1}


# What GET …/metrics/ answers for brave-otter-4: the running job's last values; the others have none.
METRICS_JOBS = [
    {"job": "download-base-model", "attempts": [], "system": [], "training": [], "last": {}, "dropped": 0,
     "malformed": 0, "frames_dropped": 0},
    {"job": "finetune-model", "attempts": [], "system": ["cpu", "memory", "gpu0.util", "gpu0.memory",
     "gpu0.memory_total"], "training": ["loss"], "dropped": 0, "malformed": 3, "frames_dropped": 0,
     "last": {"loss": _last(0.3125, 500), "cpu": _last(97.0), "memory": _last(1.5 * 2**30),
              "gpu0.util": _last(85.0), "gpu0.memory": _last(12 * 2**30), "gpu0.memory_total": _last(16 * 2**30)}},
]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "detail", "said"),
    [
        (
            "reproduced",
            "every artifact byte-identical (3 files)",
            "reproduced — every artifact byte-identical (3 files)",
        ),
        ("differs", "train ./model (m.bin)", "differs: train ./model (m.bin)"),
        ("not_comparable", "the re-run failed", "not comparable: the re-run failed"),
        ("pending", "the re-run has not finished", "pending (the re-run has not finished)"),
    ],
)
def test_show_says_whether_a_rerun_reproduced_its_original(
    monkeypatch: pytest.MonkeyPatch, state: str, detail: str, said: str
):
    run = {
        **make_run("succeeded", name="brave-otter-5"),
        "rerun_of": "brave-otter-4",
        "reproduced": {"state": state, "detail": detail, "differences": []},
    }
    rest = FakeRest(
        {
            ("GET", f"{WS}/runs/brave-otter-5/"): httpx.Response(200, json=run),
            ("GET", f"{WS}/runs/brave-otter-5/artifacts/"): httpx.Response(200, json=[]),
            # A server without metrics: show says nothing of them.
            ("GET", f"{WS}/runs/brave-otter-5/metrics/"): httpx.Response(404, json={"message": "Not found."}),
            ("GET", f"{WS}/runs/brave-otter-5/exports/"): httpx.Response(404, json={"message": "Not found."}),
        }
    )
    use(monkeypatch, "http://fake", rest)

    code, out, _ = invoke("show", "brave-otter-5")

    assert code == 0
    assert out.splitlines()[:2] == ["Run brave-otter-5 of hello: succeeded", f"Re-run of brave-otter-4: {said}"]


# ------------------------------------------------------------ tags


def test_tag_add_new_and_moved(monkeypatch: pytest.MonkeyPatch):
    tag = {
        "name": "best-model",
        "run": "brave-otter-3",
        "run_id": "r3",
        "created_by": "alice",
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
    }
    for status, message in (
        (201, "Tagged best-model → run brave-otter-3\n"),
        (200, "Moved tag best-model → run brave-otter-3\n"),
    ):
        rest = FakeRest({("POST", f"{WS}/tags/"): httpx.Response(status, json=tag)})
        use(monkeypatch, "http://fake", rest)
        assert invoke("tag", "add", "best-model", "brave-otter-3", *(["--force"] if status == 200 else [])) == (
            0,
            "",
            message,
        )
        assert json.loads(rest.requests[0].content) == {
            "name": "best-model",
            "run": "brave-otter-3",
            "force": status == 200,
        }


def test_tag_add_on_a_tag_of_another_run_says_where_it_points_and_how_to_move_it(monkeypatch: pytest.MonkeyPatch):
    tags = [
        {
            "name": "best-model",
            "run": "brave-otter-2",
            "run_id": "r2",
            "created_by": "alice",
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
        }
    ]
    rest = FakeRest({
        ("POST", f"{WS}/tags/"): httpx.Response(409, json={"message": "Tag best-model already points to run brave-otter-2; use force to move it.", "extra": {}}),
        ("GET", f"{WS}/tags/"): httpx.Response(200, json=tags),
    })  # fmt: skip
    use(monkeypatch, "http://fake", rest)
    assert invoke("tag", "add", "best-model", "brave-otter-3") == (
        1,
        "",
        "error: tag best-model already points to brave-otter-2; use --force to move it\n",
    )


def test_tag_ls_and_rm(monkeypatch: pytest.MonkeyPatch):
    tags = [
        {
            "name": "best-model",
            "run": "brave-otter-2",
            "run_id": "r2",
            "created_by": "alice",
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
        }
    ]
    rest = FakeRest(
        {
            ("GET", f"{WS}/tags/"): httpx.Response(200, json=tags),
            ("DELETE", f"{WS}/tags/best-model/"): httpx.Response(204),
        }
    )
    use(monkeypatch, "http://fake", rest)
    code, out, _ = invoke("tag", "ls")
    assert (
        code == 0
        and out.splitlines()[0].split() == ["TAG", "RUN", "CREATED", "BY", "UPDATED"]
        and out.splitlines()[1].split()[:3] == ["best-model", "brave-otter-2", "alice"]
    )
    assert json.loads(invoke("tag", "ls", "--json")[1]) == tags
    assert invoke("tag", "rm", "best-model") == (0, "", "Removed tag best-model\n")


# ------------------------------------------------------------ secrets


def invoke_with_input(stdin: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_secrets_set_reads_the_value_from_stdin_without_the_trailing_newline(monkeypatch: pytest.MonkeyPatch):
    stored = {"name": "WANDB_API_KEY", "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}
    rest = FakeRest({("PUT", f"{WS}/secrets/WANDB_API_KEY/"): httpx.Response(200, json=stored)})
    use(monkeypatch, "http://fake", rest)
    code, out, err = invoke_with_input("s3cr et\n", "secrets", "set", "WANDB_API_KEY")
    assert (code, out, err) == (
        0,
        "",
        "Secret WANDB_API_KEY set; a job gets it as $WANDB_API_KEY when its workflow names it (secrets: [WANDB_API_KEY])\n",
    )
    assert json.loads(rest.requests[0].content) == {"value": "s3cr et"}


def test_secrets_set_refuses_an_empty_value_and_a_bad_name(monkeypatch: pytest.MonkeyPatch):
    rest = FakeRest({})
    use(monkeypatch, "http://fake", rest)
    code, _, err = invoke_with_input("\n", "secrets", "set", "TOKEN")
    assert code == 1 and err.startswith("error: empty value: nothing was set")
    code, _, err = invoke_with_input("x", "secrets", "set", "1TOKEN")
    assert code == 2 and "a secret name is an environment variable name" in err
    assert rest.requests == []


def test_secrets_ls_shows_names_only_and_rm(monkeypatch: pytest.MonkeyPatch):
    found = [{"name": "WANDB_API_KEY", "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}]
    rest = FakeRest(
        {
            ("GET", f"{WS}/secrets/"): httpx.Response(200, json=found),
            ("DELETE", f"{WS}/secrets/WANDB_API_KEY/"): httpx.Response(204),
        }
    )
    use(monkeypatch, "http://fake", rest)
    code, out, _ = invoke("secrets", "ls")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["SECRET", "WANDB_API_KEY"]
    assert json.loads(invoke("secrets", "ls", "--json")[1]) == found
    assert invoke("secrets", "rm", "WANDB_API_KEY") == (0, "", "Removed secret WANDB_API_KEY\n")

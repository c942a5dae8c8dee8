"""Operating the real thing (docs/DEPLOY.md): readiness follows Postgres
going away and coming back, and the metrics move as a user's work does.

Each test runs on servers of its own (an embedded Postgres it can stop, a
Valkey it can read from the start), so stopping them disturbs no other test.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend.embedded.services import EmbeddedServices
from tests.e2e.conftest import FINISHED, User, make_repo, run_name_of
from tests.support.stack import REPO_ROOT, Stack, reported
from tests.support.web import WebServer

pytestmark = pytest.mark.slow

TOKEN = "metrics-" + secrets.token_hex(16)
LINES = 500
PRINTER = f"""workflows:
  - name: printer
    provider: bash
    commands:
      - for i in $(seq 1 {LINES}); do echo "line $i of a job that prints {LINES}"; done
"""
T = TypeVar("T")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# --- readiness follows Postgres -------------------------------------------------


@pytest.fixture
def postgres() -> Iterator[EmbeddedServices]:
    """Postgres runs as the ``pgserver`` user, which must reach its data dir:
    pytest's own temp root is private to root (0700), so not under it."""
    root = Path(tempfile.mkdtemp(prefix="trainyard-readyz-"))
    root.chmod(0o755)
    services = EmbeddedServices(data_dir=root / "postgres", valkey=False)
    try:
        services.start()
        yield services
    finally:
        services.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_readyz_goes_unready_while_postgres_is_stopped_and_ready_once_it_is_back(
    postgres: EmbeddedServices, tmp_path: Path
) -> None:
    assert postgres.urls.database_url
    env = {"DATABASE_URL": postgres.urls.database_url}
    _manage(env, "migrate", "--noinput")
    (tmp_path / "web").mkdir()
    server = WebServer(data_dir=tmp_path / "web", env=env).start()
    try:
        assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200

        postgres.stop()
        started = time.monotonic()
        down = httpx.get(f"{server.url}/readyz", timeout=10)
        took = time.monotonic() - started
        alive = httpx.get(f"{server.url}/healthz", timeout=10)

        postgres.start()
        back = _eventually(lambda: httpx.get(f"{server.url}/readyz", timeout=10), lambda r: r.status_code == 200)
    finally:
        server.stop()

    assert down.status_code == 503, down.text
    body = down.json()
    assert body["status"] == "unready"
    assert body["checks"]["database"]["ok"] is False
    assert body["checks"]["database"]["error"]  # the driver's own words, e.g. the socket it could not reach
    assert body["checks"]["migrations"] == {"ok": False, "error": "not checked: the database is unreachable"}
    assert body["checks"]["redis"] == {"ok": True}
    assert body["message"].startswith("not ready: database: ")
    assert took < 3.0
    assert (alive.status_code, alive.json()) == (200, {"status": "ok"})  # the process itself is up
    assert back.json()["status"] == "ready"


# --- metrics move with the work --------------------------------------------------


@pytest.fixture(scope="module")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServices]:
    services = EmbeddedServices(
        data_dir=tmp_path_factory.mktemp("ops-valkey"), postgres=False, valkey_port=_free_port()
    )
    try:
        services.start()
        yield services
    finally:
        services.stop()


@pytest.fixture(scope="module")
def ops_stack(valkey: EmbeddedServices, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    assert valkey.urls.redis_url
    stack = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=valkey.urls.redis_url,
        data_dir=tmp_path_factory.mktemp("ops-stack"),
    )
    stack.env.update(TRAINYARD_METRICS_TOKEN=TOKEN, TRAINYARD_RECONCILE_SECONDS="1")
    reported("ops_stack", stack)
    try:
        stack.start_all()
        yield stack
    finally:
        stack.close()


def test_a_finished_run_and_its_log_show_in_the_metrics(ops_stack: Stack, tmp_path: Path) -> None:
    alice = User("alice", ops_stack.issue_token("alice"), ops_stack)
    repo = make_repo(tmp_path / "tiny-train")
    (repo / ".trainyard" / "workflows.yaml").write_text(PRINTER)
    before = _scrape(ops_stack)

    name = run_name_of(alice.cli(repo, "run", "printer", "-d"))
    run = alice.wait(name, lambda r: r["status"] in FINISHED, timeout=120)
    assert run["status"] == "succeeded", run
    after = _eventually(lambda: _scrape(ops_stack), lambda s: s[("trainyard_log_lines_total", ())] > 0)

    runs = {state: after[("trainyard_runs", (("state", state),))] for state in ("pending", "running", "succeeded")}
    assert runs == {"pending": 0, "running": 0, "succeeded": before[("trainyard_runs", (("state", "succeeded"),))] + 1}
    assert after[("trainyard_log_lines_total", ())] - before[("trainyard_log_lines_total", ())] == LINES
    printed = sum(len(f"line {i} of a job that prints {LINES}") for i in range(1, LINES + 1))
    assert after[("trainyard_log_bytes_total", ())] - before[("trainyard_log_bytes_total", ())] == printed
    assert after[("trainyard_jobs_pending", ())] == 0
    assert after[("trainyard_schedule_lag_seconds", ())] == 0
    # The job's machine (a local runner) was launched and said hello: one provisioning time.
    assert after[("trainyard_provisioning_seconds_count", ())] == 1
    assert 0 < after[("trainyard_provisioning_seconds_sum", ())] < 60
    # Its runner stays connected, idle, waiting for the next job.
    connected = _eventually(
        lambda: _scrape(ops_stack), lambda s: s[("trainyard_websocket_connections", (("kind", "runner"),))] == 1
    )
    assert connected[("trainyard_websocket_connections", (("kind", "follower"),))] == 0


def _scrape(stack: Stack) -> Samples:
    response = httpx.get(f"{stack.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def _eventually(get: Callable[[], T], until: Callable[[T], bool], timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    value = get()
    while not until(value):
        assert time.monotonic() < deadline, f"not within {timeout} s: {value}"
        time.sleep(0.3)
        value = get()
    return value


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), *args],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        timeout=180,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

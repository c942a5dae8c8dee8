"""/healthz, /readyz and /metrics on the real ASGI server (uvicorn), against
the test database and the suite's Redis (docs/DEPLOY.md, "Health checks"
and "Metrics"). Postgres stopping under a running server is in
tests/e2e/test_operations.py, with its own Postgres."""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from backend.core import counters
from backend.runs.models import Run, RunStatus
from tests.support.fixtures import Person
from tests.support.web import WebServer, WebServers

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "metrics-" + secrets.token_hex(16)
READY_WITHIN_SECONDS = 3.0  # the checks' timeouts are 2 s


@pytest.fixture
def server(web_server: WebServers) -> WebServer:
    # Its own key prefix in Redis: counters start at zero.
    return web_server.start(TRAINYARD_METRICS_TOKEN=TOKEN, TRAINYARD_CHANNEL_PREFIX=f"t-{secrets.token_hex(4)}")


def scrape(server: WebServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.2)


# --- health and readiness ------------------------------------------------------


def test_healthz_answers_a_probe_by_ip_over_plain_http_on_an_https_site(web_server: WebServers) -> None:
    server = web_server.start(
        TRAINYARD_HTTPS="true",
        TRAINYARD_PUBLIC_URL="https://trainyard.example.com",
        DJANGO_ALLOWED_HOSTS="trainyard.example.com,127.0.0.1",
    )
    probe = {"Host": "10.0.0.7:8000"}  # a load balancer probes the process by its own address

    health = httpx.get(f"{server.url}/healthz", headers=probe, timeout=10)
    ready = httpx.get(f"{server.url}/readyz", headers=probe, timeout=10)

    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert ready.status_code == 200, ready.text
    # The rest of the site keeps its host check and its HTTPS redirect.
    assert httpx.get(f"{server.url}/api/v1/me/", headers=probe, timeout=10).status_code == 400
    assert httpx.get(f"{server.url}/api/v1/me/", timeout=10).status_code == 301


def test_readyz_is_ready_when_the_database_migrations_and_redis_are(server: WebServer) -> None:
    started = time.monotonic()
    response = httpx.get(f"{server.url}/readyz", timeout=10)

    assert response.status_code == 200
    assert response.json() == {
        "status": "ready",
        "checks": {"database": {"ok": True}, "migrations": {"ok": True}, "redis": {"ok": True}},
    }
    assert time.monotonic() - started < READY_WITHIN_SECONDS


def test_readyz_is_unready_while_a_migration_is_not_applied(server: WebServer) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM django_migrations WHERE app = 'runs' ORDER BY name DESC LIMIT 1")
        (latest,) = cursor.fetchone()
        cursor.execute("DELETE FROM django_migrations WHERE app = 'runs' AND name = %s", [latest])
    try:
        response = httpx.get(f"{server.url}/readyz", timeout=10)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO django_migrations (app, name, applied) VALUES ('runs', %s, now())", [latest])

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unready"
    assert body["checks"]["database"] == {"ok": True}
    assert body["checks"]["redis"] == {"ok": True}
    assert body["checks"]["migrations"] == {
        "ok": False,
        "error": f"1 not applied: runs.{latest}; run `manage.py migrate`",
    }
    assert body["message"] == f"not ready: migrations: 1 not applied: runs.{latest}; run `manage.py migrate`"
    assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200  # applied again: ready again


def test_readyz_names_redis_when_it_cannot_be_reached(web_server: WebServers) -> None:
    server = web_server.start(REDIS_URL=f"redis://127.0.0.1:{_closed_port()}/0")

    started = time.monotonic()
    response = httpx.get(f"{server.url}/readyz", timeout=10)

    assert response.status_code == 503
    body = response.json()
    assert body["checks"]["database"] == {"ok": True}
    assert body["checks"]["migrations"] == {"ok": True}
    assert body["checks"]["redis"]["ok"] is False
    assert "Connection refused" in body["checks"]["redis"]["error"]
    assert body["message"].startswith("not ready: redis: ")
    assert time.monotonic() - started < READY_WITHIN_SECONDS


def test_a_frozen_redis_fails_readyz_in_2s_without_holding_up_other_requests(web_server: WebServers) -> None:
    with socket.socket() as frozen:  # accepts connections, never answers
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)
        server = web_server.start(REDIS_URL=f"redis://127.0.0.1:{frozen.getsockname()[1]}/0")

        with ThreadPoolExecutor(max_workers=1) as pool:
            started = time.monotonic()
            probe = pool.submit(httpx.get, f"{server.url}/readyz", timeout=10)
            time.sleep(0.3)  # the probe is waiting on Redis now
            other = httpx.get(f"{server.url}/api/v1/health/", timeout=10)  # a sync Django view
            other_done = time.monotonic() - started
            response = probe.result()
            probe_done = time.monotonic() - started

    assert other.status_code == 200
    assert other_done < 1.5, f"a request waited {other_done:.1f} s behind the probe"
    assert response.status_code == 503
    assert response.json()["checks"]["redis"]["ok"] is False
    assert response.json()["checks"]["database"] == {"ok": True}
    assert 1.5 < probe_done < READY_WITHIN_SECONDS + 0.5


def test_probes_answer_only_get_and_head(server: WebServer) -> None:
    assert httpx.post(f"{server.url}/healthz", timeout=10).status_code == 405
    assert httpx.head(f"{server.url}/readyz", timeout=10).status_code == 200


# --- metrics ------------------------------------------------------------------


def test_metrics_are_off_without_a_token_and_say_how_to_turn_them_on(web_server: WebServers) -> None:
    server = web_server.start()

    response = httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer anything"}, timeout=10)

    assert response.status_code == 404
    assert "Set TRAINYARD_METRICS_TOKEN" in response.text
    assert "Authorization: Bearer <token>" in response.text


@pytest.mark.parametrize(
    "header",
    [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x"],
    ids=["none", "wrong", "basic", "longer"],  # the same in every worker: the token is random
)
def test_metrics_refuse_a_missing_or_wrong_token(server: WebServer, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}

    response = httpx.get(f"{server.url}/metrics", headers=headers, timeout=10)

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer realm="metrics"'
    assert "trainyard_" not in response.text


def test_metrics_count_runs_by_state_and_pending_jobs(server: WebServer, run: Run) -> None:
    before = scrape(server)
    assert before[("trainyard_runs", (("state", "pending"),))] == 1
    assert before[("trainyard_runs", (("state", "succeeded"),))] == 0
    assert before[("trainyard_jobs_pending", ())] == 1
    assert before[("trainyard_schedule_lag_seconds", ())] >= 0
    assert before[("trainyard_heartbeat_lag_seconds", ())] == 0

    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    after = scrape(server)

    assert after[("trainyard_runs", (("state", "pending"),))] == 0
    assert after[("trainyard_runs", (("state", "succeeded"),))] == 1
    for name in ("trainyard_log_lines_total", "trainyard_log_bytes_total", "trainyard_provisioning_seconds_count"):
        assert after[(name, ())] == 0, name


def test_metrics_count_open_follower_websockets(server: WebServer, run: Run, member: Person) -> None:
    url = f"{server.ws_url}/ws/v1/workspaces/acme/runs/{run.name}/"
    follower = ("trainyard_websocket_connections", (("kind", "follower"),))
    runner = ("trainyard_websocket_connections", (("kind", "runner"),))
    assert scrape(server)[follower] == 0

    with connect(url, additional_headers={"Authorization": f"Bearer {member.token}"}, open_timeout=10) as ws:
        ws.recv(timeout=10)
        eventually(lambda: scrape(server)[follower] == 1)
        assert scrape(server)[runner] == 0

    eventually(lambda: scrape(server)[follower] == 0)


def test_any_web_process_counts_the_websockets_of_all_and_forgets_a_crashed_one(
    web_server: WebServers, run: Run, member: Person
) -> None:
    env = {"TRAINYARD_METRICS_TOKEN": TOKEN, "TRAINYARD_CHANNEL_PREFIX": f"t-{secrets.token_hex(4)}"}
    holding, scraped = web_server.start(**env), web_server.start(**env)
    url = f"{holding.ws_url}/ws/v1/workspaces/acme/runs/{run.name}/"
    follower = ("trainyard_websocket_connections", (("kind", "follower"),))

    with connect(url, additional_headers={"Authorization": f"Bearer {member.token}"}, open_timeout=10) as ws:
        ws.recv(timeout=10)
        eventually(lambda: scrape(scraped)[follower] == 1)
        holding.kill()  # no disconnect is ever counted: its published count must expire
        eventually(lambda: scrape(scraped)[follower] == 0, timeout=counters.CONNECTIONS_TTL_SECONDS + 15)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

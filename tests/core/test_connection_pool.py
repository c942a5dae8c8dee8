"""The web process pools its database connections (docs/decisions/0059-connection-pool.md).

Under uvicorn each request's sync code runs in a new thread and Django's
connections are per thread: without a pool every request opened a Postgres
connection of its own. Counted by Postgres itself: ``pg_stat_database.sessions``
is how many sessions were ever opened to the test database, the real web
process's included.
"""

from __future__ import annotations

import time

import httpx
from django.db import connection

from tests.support.fixtures import *  # noqa: F403 - the tenant fixtures
from tests.support.fixtures import Person
from tests.support.web import WebServer, WebServers

REQUESTS = 30


def _sessions() -> int:
    """Sessions opened to this database so far. A backend reports its own
    when its first transaction ends, or when it exits: wait until the count
    stops moving."""
    seen = -1
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
            (count,) = cursor.fetchone()
        if count == seen:
            return count
        seen = count
        time.sleep(1.0)


def _sessions_opened_by(server: WebServer, person: Person, requests: int) -> int:
    headers = {"Authorization": f"Bearer {person.token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=10) as client:
        assert client.get("/api/v1/me/").status_code == 200  # the pool opened
        before = _sessions()
        for _ in range(requests):
            assert client.get("/api/v1/me/").status_code == 200
        return _sessions() - before


def test_the_web_process_reuses_its_connections(web_server: WebServers, owner: Person) -> None:
    server = web_server.start()  # the web process's default: pooled

    assert _sessions_opened_by(server, owner, REQUESTS) <= 2


def test_without_the_pool_each_request_opens_a_connection(web_server: WebServers, owner: Person) -> None:
    """What the pool saves, and proof the count above can fail."""
    server = web_server.start(TRAINYARD_DB_POOL="0")

    assert _sessions_opened_by(server, owner, REQUESTS) >= REQUESTS


def test_requests_give_their_connections_back(web_server: WebServers, owner: Person) -> None:
    """A pool of two with a short wait: requests that kept their connections
    would make the third one wait 2 s and fail. A large body's credential is
    checked before Django (backend/config/body_limit.py), in a database call
    of its own."""
    server = web_server.start(TRAINYARD_DB_POOL_MAX="2", TRAINYARD_DB_POOL_TIMEOUT="2")
    large = b"x" * 100_000  # over TRAINYARD_UNAUTHENTICATED_BODY_BYTES

    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {owner.token}"}, timeout=10) as client:
        for _ in range(10):
            assert client.get("/api/v1/me/").status_code == 200
            assert client.post("/api/v1/me/", content=large).status_code == 405

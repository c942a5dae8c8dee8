"""Issue 33: a user's open browser and CLI websockets are capped
(TRAINYARD_WS_PER_USER), counted in Redis by every web process together; a
socket gives its slot back when it closes, and the slots of a process that
died expire. Real uvicorn processes, real websockets, real Redis."""

from __future__ import annotations

import contextlib
import secrets
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection

from backend.runs.models import Run
from tests.runs.test_follow_access import closed_with, first_frame, follow
from tests.support.fixtures import Person
from tests.support.web import WebServer, WebServers

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 2
REFUSED = (4429, f"too many open websockets: at most {LIMIT} per user (TRAINYARD_WS_PER_USER); close one and retry")


def _servers(web_server: WebServers, count: int) -> list[WebServer]:
    # One prefix for the servers of this test: they share the counts, and no other test's.
    env = {
        "TRAINYARD_WS_PER_USER": str(LIMIT),
        "TRAINYARD_WS_RECHECK_SECONDS": "1",
        "TRAINYARD_CHANNEL_PREFIX": f"slots-{secrets.token_hex(4)}",
    }
    return [web_server.start(**env) for _ in range(count)]


def _auth(person: Person) -> dict[str, str]:
    return {"Authorization": f"Bearer {person.token}"}


def _opened(server: WebServer, run: Run, person: Person) -> ClientConnection:
    ws = follow(server, run, _auth(person))
    assert first_frame(ws)["type"] == "run"
    return ws


def _open_within(server: WebServer, run: Run, person: Person, seconds: float) -> tuple[ClientConnection, float]:
    """A follow that opens within ``seconds`` (refused ones retried), and how long it took."""
    started = time.monotonic()
    while True:
        ws = follow(server, run, _auth(person))
        try:
            if first_frame(ws)["type"] == "run":
                return ws, time.monotonic() - started
        except ConnectionClosed:
            pass
        ws.close()
        assert time.monotonic() - started < seconds, "the socket was still refused"
        time.sleep(0.2)


def test_the_socket_over_the_cap_is_refused_naming_the_limit_across_web_processes(
    web_server: WebServers, run: Run, member: Person, owner: Person
) -> None:
    one, two = _servers(web_server, 2)
    first = _opened(one, run, member)
    second = _opened(two, run, member)

    over = follow(two, run, _auth(member))
    assert closed_with(over) == REFUSED
    other = _opened(one, run, owner)  # another user's sockets are counted apart

    first.close()  # its slot is given back: the next connect, in the other process, is let in
    again, _ = _open_within(two, run, member, seconds=5)
    for ws in (second, other, again):
        ws.close()


def test_the_slots_of_a_web_process_that_died_expire(web_server: WebServers, run: Run, member: Person) -> None:
    doomed, survivor = _servers(web_server, 2)
    held = [_opened(doomed, run, member) for _ in range(LIMIT)]
    assert doomed._process is not None
    doomed._process.kill()  # SIGKILL: no disconnect handler runs, the slots stay in Redis
    doomed._process.wait()

    refused = follow(survivor, run, _auth(member))
    assert closed_with(refused) == REFUSED
    ws, waited = _open_within(survivor, run, member, seconds=10)  # three missed re-checks of 1 s, then expired
    assert waited >= 1
    ws.close()
    for dead in held:
        with contextlib.suppress(OSError, InvalidStatus):
            dead.close()

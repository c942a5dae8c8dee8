"""A web process writes its pulse (backend/clouds/pulse.py) whether or not
its server sends the ASGI lifespan; without one it says so. The real uvicorn,
once with ``--lifespan off``."""

from __future__ import annotations

import time

import pytest

from backend.clouds.models import WebPulse
from backend.clouds.pulse import NO_LIFESPAN
from tests.support.web import WebServers

pytestmark = pytest.mark.django_db(transaction=True)


def _pulses_within(seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while not WebPulse.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return WebPulse.objects.count()


def test_a_server_without_lifespan_pulses_from_its_first_request_and_says_so(web_server: WebServers) -> None:
    server = web_server.start_with(("--lifespan", "off"))  # its readiness check is the first request

    assert _pulses_within(10) == 1
    assert NO_LIFESPAN in server.log()


def test_a_server_with_lifespan_pulses_and_warns_of_nothing(web_server: WebServers) -> None:
    server = web_server.start()

    assert _pulses_within(10) == 1
    assert "sent no ASGI lifespan" not in server.log()

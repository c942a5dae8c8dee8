"""The CLI talking to the real API in the test's process: httpx's WSGI
transport into Django, on the test's database connection (as Django's test
client does), so what it reads is what the test wrote."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from click.testing import CliRunner
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from trainyard.api import Client
from trainyard.cli import cli

from backend.accounts.models import Workspace
from tests.support.fixtures import Person


@contextmanager
def in_the_tests_transaction() -> Iterator[None]:
    """Requests keep the test's database connection instead of closing it."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def cli_as(monkeypatch: pytest.MonkeyPatch, team: Workspace, person: Person) -> None:
    """``trainyard`` commands run as ``person`` in ``team`` (ALLOWED_HOSTS must accept "testserver")."""
    transport = httpx.WSGITransport(app=get_wsgi_application())
    monkeypatch.setattr(
        "trainyard.commands.common.client",
        lambda: Client("http://testserver", person.token, team.slug, transport=transport),
    )


def cli_invoke(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``trainyard ARGS``."""
    result = CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr

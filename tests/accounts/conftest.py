"""Tenant fixtures, and a local GitHub the server is configured to sign in with."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fixtures import *  # noqa: F403
from tests.support.github import GithubServer

CALLBACK_URL = "http://testserver/auth/complete/github/"


@pytest.fixture
def github(settings: Any) -> Iterator[GithubServer]:
    """A running GitHub stand-in; the settings point sign-in at it (and switch local login off, as in production)."""
    server = GithubServer(client_id="Iv1.trainyardtest", client_secret="s3cret-test", callback_url=CALLBACK_URL).start()
    settings.GITHUB_CLIENT_ID = server.client_id
    settings.GITHUB_CLIENT_SECRET = server.client_secret
    settings.GITHUB_URL = server.url
    settings.GITHUB_API_URL = server.api_url
    settings.TRAINYARD_LOCAL_LOGIN = False
    try:
        yield server
    finally:
        server.close()

"""Smoke tests of the end-to-end stack itself: it starts, serves, restarts."""

from __future__ import annotations

import httpx
import pytest

from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def test_health_answers_200_with_json(stack: Stack) -> None:
    response = httpx.get(f"{stack.url}/api/v1/health/", timeout=10)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")


def test_issued_token_authenticates_the_api(stack: Stack) -> None:
    stack.manage("ensure_admin")
    token = stack.issue_token("admin")

    response = httpx.get(f"{stack.url}/api/v1/me/", headers={"Authorization": f"Bearer {token}"}, timeout=10)

    assert response.status_code == 200
    assert response.json()["username"] == "admin"


def test_web_answers_again_after_a_restart(stack: Stack) -> None:
    stack.restart("web")

    response = httpx.get(f"{stack.url}/api/v1/health/", timeout=10)

    assert response.status_code == 200
    assert stack.running("worker") and stack.running("beat")

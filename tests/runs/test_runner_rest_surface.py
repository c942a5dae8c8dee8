"""The runner's REST surface is declared in one place and guarded alike:
every ``api/v1/runner/…`` route comes from ``backend.runs.api.runner_urls``,
and every one but ``register/`` (whose body carries a registration token)
authenticates with the runner's token and fences with a runner permission.
Each refusal answers its own status and message, the same on every route
(docs/API.md); what each kind of caller gets on each route is
tests/core/access_matrix.py's to say."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from backend.accounts.models import Workspace
from backend.runs.api.runner_auth import (
    HoldsCurrentAttempt,
    NamesAttempt,
    RunnerAPIView,
    RunnerTokenAuthentication,
)
from backend.runs.models import Run
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.attempts import job_credential
from tests.support.runners import runner_instance

RUNNER = "api/v1/runner/"
RUNNER_URLS = "backend.runs.api.runner_urls"


def _declared(patterns: list[Any], prefix: str, module: str) -> Iterator[tuple[str, str, Any]]:
    """(route, the module declaring it, view callback) of every URL pattern but Django's admin."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            if route != "admin/":
                yield from _declared(pattern.url_patterns, route, getattr(pattern.urlconf_module, "__name__", module))
        elif isinstance(pattern, URLPattern):
            yield route, module, pattern.callback


ROUTES = list(_declared(get_resolver().url_patterns, "", "backend.config.urls"))


def test_every_runner_route_is_declared_in_runner_urls() -> None:
    runner_routes = {route: module for route, module, _ in ROUTES if route.startswith(RUNNER)}

    assert runner_routes, "no runner route found"
    assert {route for route, module in runner_routes.items() if module != RUNNER_URLS} == set()
    assert all(route.startswith(RUNNER) for route, module, _ in ROUTES if module == RUNNER_URLS)


def test_every_job_route_takes_only_a_runner_token_and_is_fenced() -> None:
    jobs = [(route, callback.view_class) for route, _, callback in ROUTES if route.startswith(f"{RUNNER}jobs/")]

    assert jobs
    for route, view in jobs:
        assert issubclass(view, RunnerAPIView), route
        assert list(view.authentication_classes) == [RunnerTokenAuthentication], route
        assert view.permission_classes, route
        assert all(issubclass(p, (NamesAttempt, HoldsCurrentAttempt)) for p in view.permission_classes), route


TOKEN = "runner-token-of-holder"
OTHER = "runner-token-of-other"


@pytest.mark.django_db
def test_each_refusal_of_a_runner_call_has_its_status_and_message(team: Workspace, run: Run) -> None:
    runner_instance(team, "holder", TOKEN, channel_name="c-holder")
    jobs_schedule()
    runner_instance(team, "other", OTHER, channel_name="c-other")
    job = run.jobs.get()
    assert job.attempt == 1

    def call(token: str | None, attempt: str | None) -> tuple[int, dict[str, Any]]:
        client = APIClient()
        if token:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        query = {} if attempt is None else {"attempt": attempt}
        answer = client.get(f"/{RUNNER}jobs/{job.pk}/secrets/", query)
        return answer.status_code, answer.json()

    which = "Say which attempt: ?attempt=N (runner protocol 2)."
    expected = {
        "no token": (None, "1", 401, "Unknown runner token."),
        "an unknown token": ("not-a-runner", "1", 401, "Unknown runner token."),
        "no attempt": (TOKEN, None, 400, which),
        "an attempt that is no number": (TOKEN, "²", 400, which),
        "an attempt no database integer holds": (TOKEN, "1" * 5000, 400, which),
        "another runner": (OTHER, "1", 404, "No such active job on this runner."),
        "an old attempt": (TOKEN, "0", 409, "Attempt 0 of this job is no longer current (attempt 1 is): stop it."),
        "the runner's token without the attempt's job token": (
            TOKEN,
            "1",
            401,
            "This attempt's job token is missing or wrong: send Authorization: Bearer <runner token>.<job token>"
            " (AssignJob.job_token).",
        ),
    }
    answers = {why: call(token, attempt) for why, (token, attempt, _, _) in expected.items()}

    assert answers == {
        why: (status, {"message": message, "extra": {}}) for why, (_, _, status, message) in expected.items()
    }
    assert call(job_credential(TOKEN, job), "1")[0] == 200

"""A submission while the broker is down (backend/core/enqueue.py): the run
commits, the caller gets no exception, and the reconciler's next pass asks
for the scheduling pass that could not be queued. Real Postgres and Redis;
the broker is a Redis address nothing listens on."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from celery import current_app

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.core.redis import redis_client
from backend.runs import tasks
from backend.runs.models import JobStatus, Run
from backend.runs.scheduler.coalesce import schedule_passes
from backend.runs.wakeups import DIRTY_KEY, QUEUED_KEY
from tests.support.fixtures import WORKFLOWS, Person, submit

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "celery"  # Celery's default queue: a list in the broker's Redis


@pytest.fixture(autouse=True)
def _empty_queue() -> Iterator[None]:
    redis_client().delete(QUEUE, DIRTY_KEY, QUEUED_KEY)
    yield
    redis_client().delete(QUEUE, DIRTY_KEY, QUEUED_KEY)


@contextmanager
def broker_down() -> Iterator[None]:
    """The app publishes to a port nothing listens on, with fresh connection pools."""
    conf = current_app.conf
    kept = conf.broker_url, conf.broker_write_url
    _reset_pools()
    conf.broker_url = conf.broker_write_url = "redis://127.0.0.1:1/0"
    try:
        yield
    finally:
        _reset_pools()
        conf.broker_url, conf.broker_write_url = kept


def _reset_pools() -> None:
    """New connections from now on (the old pools are left to the collector)."""
    current_app._pool = None
    current_app.amqp._producer_pool = None


def _queued_tasks() -> list[str]:
    return [json.loads(m)["headers"]["task"] for m in redis_client().lrange(QUEUE, 0, -1)]


def test_a_submission_while_the_broker_is_down_commits_and_the_reconciler_asks_again(
    team: Workspace, owner: Person, caplog: pytest.LogCaptureFixture
) -> None:
    with broker_down(), caplog.at_level(logging.WARNING, logger="backend.core.enqueue"):
        run = submit(team, owner.user)  # its on-commit request for a pass cannot be sent

    assert Run.objects.filter(pk=run.pk).exists()
    assert run.jobs.get().status == JobStatus.PENDING
    assert "could not enqueue backend.runs.tasks.schedule" in caplog.text
    assert _queued_tasks() == []
    assert not redis_client().exists(QUEUED_KEY), "a failed send must not block the next request"


def test_the_reconciler_queues_the_pass_a_lost_request_was_for(team: Workspace, owner: Person) -> None:
    with broker_down():
        run = submit(team, owner.user)
    Instance.objects.create(
        workspace=team,
        backend="local",
        name="local-r",
        token_hash="r" * 64,
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**30,
        channel_name="test-channel",
    )

    tasks.reconcile()  # the beat's periodic task, with the broker back

    # One scheduling pass for the lost request (an account's periodic sweep may be queued beside it).
    assert _queued_tasks().count("backend.runs.tasks.schedule") == 1
    assert schedule_passes() == 1  # what that task runs
    assert run.jobs.get().status == JobStatus.ASSIGNED


def test_a_submission_through_the_api_while_the_broker_is_down_answers_201(team: Workspace, owner: Person) -> None:
    body = {
        "workflow": "hello",
        "workflows_file": {"path": ".trainyard/workflows.yaml", "text": WORKFLOWS},
        "code": {"kind": "git", "repo_url": "https://example.com/acme/models.git", "commit": "a" * 40},
    }
    with broker_down():
        answer = owner.client().post("/api/v1/workspaces/acme/runs/", body, format="json")

    assert answer.status_code == 201, answer.content
    run = Run.objects.get(workspace=team, name=answer.json()["name"])
    assert run.jobs.get().status == JobStatus.PENDING

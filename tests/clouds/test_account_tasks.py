"""Cloud calls run in one task per account (backend/clouds/services/accountpass.py):
a slow account delays neither the reconcile pass (and the lease expiry in it)
nor another account's detection. The fake backend's ``describe_delay`` is a
cloud API that takes 20 s to answer; the tasks go through the broker's real
Redis queue."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from backend.accounts.models import Workspace
from backend.clouds import tasks
from backend.clouds.models import CloudAccount, ControlPlane, Instance, InstanceStatus, WebPulse
from backend.clouds.services.accountpass import ACCOUNT_TASK_SECONDS
from backend.core.clock import db_now
from backend.core.redis import redis_client
from backend.runs.services.reconcile import reconcile
from tests.support.accounttasks import QUEUE, TASK, run_account_tasks

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _empty_queue() -> Iterator[None]:
    redis_client().delete(QUEUE)
    yield
    redis_client().delete(QUEUE)


@pytest.fixture
def hearing() -> None:
    now = db_now()
    WebPulse.objects.create(process="web:1", at=now)
    ControlPlane.objects.create(reconciled_at=now - timedelta(seconds=1), hearing_since=now - timedelta(hours=1))


def _account(team: Workspace, tmp_path: Path, name: str, script: dict[str, object]) -> CloudAccount:
    script_file = tmp_path / f"{name}.json"
    script_file.write_text(json.dumps(script))
    config = {"state_dir": str(tmp_path / name), "script_file": str(script_file), "offers": []}
    return CloudAccount.objects.create(workspace=team, kind="fake", name=name, config=config)


def _unreachable(account: CloudAccount, name: str) -> Instance:
    """Unreachable for an hour; the cloud has never heard of its machine."""
    an_hour_ago = db_now() - timedelta(hours=1)
    return Instance.objects.create(
        workspace=account.workspace,
        account=account,
        backend="fake",
        name=name,
        idempotency_key=f"key-{name}",
        backend_id=f"fake-{name}",
        token_hash=name * 8,
        status=InstanceStatus.UNREACHABLE,
        launched_at=an_hour_ago,
        unreachable_since=an_hour_ago,
        last_heartbeat_at=an_hour_ago,
        cpus=2,
        memory_bytes=2**30,
    )


def _queued() -> list[tuple[str, list[object]]]:
    out = []
    for raw in redis_client().lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        args, _, _ = json.loads(base64.b64decode(message["body"]))
        out.append((message["headers"]["task"], args))
    return out


def test_a_slow_account_delays_neither_the_pass_nor_another_accounts_detection(
    team: Workspace, tmp_path: Path, hearing: None
) -> None:
    slow = _account(team, tmp_path, "slow", {"describe_delay": 20})
    fast = _account(team, tmp_path, "fast", {})
    stuck, gone = _unreachable(slow, "stuck"), _unreachable(fast, "gone")

    started = time.monotonic()
    reconcile()
    took = time.monotonic() - started

    assert took < 5, f"the reconcile pass waited {took:.1f}s for a cloud"
    assert sorted(_queued()) == sorted([(TASK, [str(slow.pk)]), (TASK, [str(fast.pk)])])
    redis_client().lrem(QUEUE, 1, next(r for r in redis_client().lrange(QUEUE, 0, -1) if str(slow.pk) in str(r)))
    run_account_tasks()  # the fast account's task; the slow one's is another worker's, still describing
    gone.refresh_from_db()
    stuck.refresh_from_db()
    assert (gone.status, gone.termination_reason) == (InstanceStatus.LOST, "machine_gone")
    assert stuck.status == InstanceStatus.UNREACHABLE
    assert tasks.account_reconcile.time_limit == ACCOUNT_TASK_SECONDS


def test_an_accounts_task_does_nothing_while_another_of_its_tasks_runs(
    team: Workspace, tmp_path: Path, hearing: None
) -> None:
    fast = _account(team, tmp_path, "fast", {})
    gone = _unreachable(fast, "gone")
    lock = f"clouds:account-reconcile:{fast.pk}"
    redis_client().set(lock, "1", ex=60)  # a task of the account is at it

    try:
        assert tasks.account_reconcile(str(fast.pk)) == 0
        gone.refresh_from_db()
        assert gone.status == InstanceStatus.UNREACHABLE
    finally:
        redis_client().delete(lock)

    assert tasks.account_reconcile(str(fast.pk)) == 1
    gone.refresh_from_db()
    assert gone.status == InstanceStatus.LOST

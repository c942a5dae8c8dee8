"""Liveness is judged by the database's clock (backend/core/clock.py), so a
worker whose own clock runs ahead still tells a lost runner from a live
server. The reconciler runs in a real separate process whose clock is 30 s
ahead (libfaketime, installed by .ci/run from Debian); Postgres keeps the
true time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from backend.accounts.models import Workspace
from backend.clouds.models import ControlPlane, Instance, InstanceStatus, WebPulse
from backend.core.clock import db_now
from tests.support.fixtures import Person, submit
from tests.support.testdb import django_test_db_url

pytestmark = pytest.mark.django_db(transaction=True)

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
REPO_ROOT = Path(__file__).resolve().parents[2]
# The worker's reconcile task, as beat would have it run, then its own clock.
RECONCILE = "import django, time; django.setup();from backend.runs import tasks; tasks.reconcile(); print(time.time())"


def _reconcile_in_a_worker_ahead_by(seconds: int) -> float:
    """Run the reconcile task in a new process whose clock is ``seconds``
    ahead; returns how far ahead of this process it said it was."""
    if not LIBFAKETIME.exists():
        pytest.fail(f"{LIBFAKETIME} is missing: apt-get install libfaketime (.ci/run does)")
    env = {
        **os.environ,
        "DATABASE_URL": django_test_db_url(),
        "DJANGO_SETTINGS_MODULE": "backend.config.settings",
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"+{seconds}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }
    before = time.time()
    done = subprocess.run(
        [sys.executable, "-c", RECONCILE], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return float(done.stdout.strip().splitlines()[-1]) - before


def _a_live_server_and_a_silent_runner(team: Workspace) -> Instance:
    """A web process pulsed just now and the reconciler passed a second ago;
    the runner's last heartbeat was 20 s ago (the timeout is 15 s)."""
    now = db_now()
    WebPulse.objects.create(process="web:1", at=now)
    ControlPlane.objects.create(reconciled_at=now - timedelta(seconds=1), hearing_since=now - timedelta(hours=1))
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name="local-silent",
        token_hash="s" * 64,
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**30,
        channel_name="test-channel",
        last_heartbeat_at=now - timedelta(seconds=20),
    )


def test_a_worker_whose_clock_is_30_s_ahead_still_detects_a_lost_runner(team: Workspace) -> None:
    instance = _a_live_server_and_a_silent_runner(team)

    ahead = _reconcile_in_a_worker_ahead_by(30)

    assert 29 < ahead < 60, f"the worker's clock was {ahead:.1f}s ahead, not 30"
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.UNREACHABLE
    assert instance.status_reason == "runner local-silent stopped responding (no heartbeat for 15s)"
    state = ControlPlane.objects.get()
    assert state.hearing_since is not None and db_now() - state.hearing_since > timedelta(minutes=59)


def test_a_worker_30_s_ahead_neither_expires_a_fresh_lease_nor_a_runner_just_heard(
    team: Workspace, owner: Person
) -> None:
    instance = _a_live_server_and_a_silent_runner(team)
    Instance.objects.filter(pk=instance.pk).update(last_heartbeat_at=db_now())
    run = submit(team, owner.user)  # assigned on submit to the idle runner, under a 15 s lease

    _reconcile_in_a_worker_ahead_by(30)

    instance.refresh_from_db()
    job = run.jobs.get()
    assert instance.status == InstanceStatus.BUSY
    assert job.status == "assigned", job.status_reason

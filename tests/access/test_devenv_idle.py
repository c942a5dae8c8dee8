"""Dev environments idle past their ``inactivity_duration`` are stopped by
the beat's pass: no live session and no session activity for that long,
counted from the later of the attempt's start and the sessions' last bytes."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

import pytest
from django.utils import timezone
from trainyard_spec import Source

from backend.access.models import AccessSession, SessionKind, SessionState
from backend.access.services.devenvs import dev_environments_stop_idle
from backend.accounts.models import Workspace
from backend.runs.models import Attempt, Job, JobStatus
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.runs import CodeInput, PlanInputs, run_create
from tests.support.attempts import accept, current_attempt
from tests.support.fixtures import Person
from tests.support.runners import runner_instance

WORKFLOWS = """\
workflows:
  - {name: lab, provider: lab}
  - {name: ide, provider: code, inactivity_duration: 5s}
  - {name: forever, provider: code, inactivity_duration: off}
  - {name: train, provider: bash, commands: [sleep 1000]}
"""


def _running(team: Workspace, owner: Person, workflow: str, runner: str) -> Job:
    run = run_create(
        workspace=team,
        user=owner.user,
        workflow=workflow,
        inputs=PlanInputs(files=(Source(".trainyard/workflows.yaml", WORKFLOWS),)),
        code=CodeInput(kind="git", repo_url="https://example.com/acme/models.git", commit="a" * 40),
    )
    instance = runner_instance(team, runner, f"runner-token-{runner}", channel_name=f"c-{runner}")
    jobs_schedule()
    job = run.jobs.get()
    assert accept(job, instance.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    return job


def _session(job: Job, owner: Person, state: str, last: datetime | None) -> AccessSession:
    attempt: Attempt = current_attempt(job)
    return AccessSession.objects.create(
        workspace=job.workspace,
        user=owner.user,
        job=job,
        attempt=attempt,
        instance=attempt.instance,
        kind=SessionKind.PORT,
        port=8888,
        token_hash=secrets.token_hex(32),
        relay_key_hash=secrets.token_hex(32),
        grant_expires_at=timezone.now() + timedelta(seconds=60),
        state=state,
        last_activity_at=last,
        ended_at=last if state == SessionState.ENDED else None,
    )


def _status(job: Job) -> tuple[str, str]:
    job.refresh_from_db()
    return job.status, job.status_reason


def test_a_dev_environment_no_one_entered_is_stopped_after_its_inactivity_duration(
    team: Workspace, owner: Person
) -> None:
    lab = _running(team, owner, "lab", "a")
    train = _running(team, owner, "train", "b")
    now = timezone.now()

    assert dev_environments_stop_idle(now=now + timedelta(minutes=59)) == 0
    assert _status(lab)[0] == JobStatus.RUNNING
    assert dev_environments_stop_idle(now=now + timedelta(hours=1, seconds=5)) == 1
    assert _status(lab) == (JobStatus.STOPPING, "stopped: idle for 1h (inactivity_duration)")
    assert _status(train)[0] == JobStatus.RUNNING


def test_a_live_session_keeps_it_up_however_old(team: Workspace, owner: Person) -> None:
    ide = _running(team, owner, "ide", "a")
    _session(ide, owner, SessionState.OPEN, timezone.now())

    assert dev_environments_stop_idle(now=timezone.now() + timedelta(days=3)) == 0
    assert _status(ide)[0] == JobStatus.RUNNING


@pytest.mark.parametrize(("ago", "stopped"), [(timedelta(seconds=2), False), (timedelta(seconds=10), True)])
def test_an_ended_sessions_last_activity_is_when_the_idle_time_starts(
    team: Workspace, owner: Person, ago: timedelta, stopped: bool
) -> None:
    ide = _running(team, owner, "ide", "a")
    now = timezone.now() + timedelta(minutes=10)
    _session(ide, owner, SessionState.ENDED, now - ago)

    assert dev_environments_stop_idle(now=now) == int(stopped)
    status, reason = _status(ide)
    if stopped:
        assert (status, reason) == (JobStatus.STOPPING, "stopped: idle for 5s (inactivity_duration)")
    else:
        assert status == JobStatus.RUNNING


@pytest.mark.parametrize(("ago", "stopped"), [(timedelta(minutes=50), False), (timedelta(minutes=70), True)])
def test_jupyters_own_activity_as_its_runner_reports_it_counts(
    team: Workspace, owner: Person, ago: timedelta, stopped: bool
) -> None:
    lab = _running(team, owner, "lab", "a")
    now = timezone.now() + timedelta(hours=3)
    Job.objects.filter(pk=lab.pk).update(app_active_at=now - ago)

    assert dev_environments_stop_idle(now=now) == int(stopped)
    assert _status(lab)[0] == (JobStatus.STOPPING if stopped else JobStatus.RUNNING)


def test_inactivity_duration_off_is_never_stopped(team: Workspace, owner: Person) -> None:
    forever = _running(team, owner, "forever", "a")

    assert dev_environments_stop_idle(now=timezone.now() + timedelta(days=30)) == 0
    assert _status(forever)[0] == JobStatus.RUNNING

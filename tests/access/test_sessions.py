"""Granting a session into a running job, and every way one ends: by its
user or an admin, when its attempt ends (a spot notice says what to do), and
by the sweep (an unused grant, a terminal not reattached, an idle session).
Over the REST API where a user would ask; the relay itself is in
tests/access/test_pipe.py and tests/e2e/test_relay_scale_out.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from backend.access.models import AccessSession, SessionState
from backend.access.services.ends import client_attach, end_detach
from backend.access.services.sessions import APP_PROXY, SPOT_REASON, AccessRefused, grant_session
from backend.access.services.sweep import sessions_sweep
from backend.accounts.models import AuditEvent, Workspace
from backend.accounts.services.ssh_keys import ssh_key_add
from backend.clouds.models import Instance
from backend.clouds.services.selfhosted import registration_token_create, runner_register
from backend.runs.lifecycle.transitions import job_assign
from backend.runs.models import Job, JobStatus, Run
from tests.support.attempts import accept, report
from tests.support.fixtures import WORKFLOWS, Person, submit

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl mateo@laptop"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHOSTKEYxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx runner"
DOCKER = (
    WORKFLOWS
    + """\
  - name: boxed
    provider: docker
    image: ubuntu:24.04
    commands: [sleep 60]
"""
)


@pytest.fixture
def running(team: Workspace, owner: Person) -> Run:
    """A one-job run running on a connected runner that serves sessions."""
    return running_on_a_runner(team, owner, submit(team, owner.user))


def running_on_a_runner(team: Workspace, owner: Person, run: Run, *, relay: int = 1) -> Run:
    registered = runner_register(token=registration_token_create(workspace=team, user=owner.user).token, name="box")
    job = run.jobs.get()
    with transaction.atomic():
        job_assign(job=Job.objects.select_for_update().get(pk=job.pk), instance=registered.instance)
    assert accept(job, registered.instance.pk)
    Instance.objects.filter(pk=registered.instance.pk).update(
        status="busy", channel_name="specific.test!runner", relay_version=relay, ssh_host_key=HOST_KEY
    )
    return run


def _grant(person: Person, run: Run, **body: Any) -> Any:
    body = {"kind": "port", "port": 8888, **body}
    return person.client().post(f"/api/v1/workspaces/acme/runs/{run.name}/sessions/", body, format="json")


# ------------------------------------------------------------------ grants


def test_a_member_gets_a_grant_bound_to_the_jobs_running_attempt(running: Run, member: Person) -> None:
    response = _grant(member, running)

    assert response.status_code == 201, response.json()
    grant = response.json()
    session = AccessSession.objects.get(pk=grant["id"])
    assert grant["token"].startswith("tyses_") and grant["url"].endswith(f"/ws/v1/relay/{grant['id']}/")
    assert (grant["run"], grant["job"], grant["attempt"], grant["kind"]) == (running.name, "hello", 1, "port")
    assert grant["host_alias"] == f"trainyard-{running.name}"
    assert (session.state, session.user, session.attempt.number, session.port) == ("granted", member.user, 1, 8888)
    assert session.grant_expires_at > timezone.now() + timedelta(seconds=50)


def test_an_ssh_grant_carries_the_runners_host_key_and_needs_a_registered_key(running: Run, member: Person) -> None:
    refused = _grant(member, running, kind="ssh", port=None)
    ssh_key_add(user=member.user, public_key=KEY)
    granted = _grant(member, running, kind="ssh", port=None)

    assert refused.status_code == 409
    assert "register one: trainyard ssh-key add" in refused.json()["message"]
    assert granted.status_code == 201 and granted.json()["host_key"] == HOST_KEY


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (JobStatus.PENDING, "job hello is pending: wait until it runs"),
        (JobStatus.SUCCEEDED, "job hello has finished (succeeded): sessions reach running jobs only"),
        (JobStatus.STOPPING, "job hello is stopping"),
    ],
)
def test_a_job_that_is_not_running_is_refused_with_what_to_do(
    running: Run, member: Person, status: str, said: str
) -> None:
    Job.objects.filter(run=running).update(status=status)

    response = _grant(member, running)

    assert (response.status_code, response.json()["message"][: len(said)]) == (409, said)
    assert not AccessSession.objects.exists()


def test_a_cached_job_is_refused(running: Run, owner: Person, member: Person, team: Workspace) -> None:
    source = submit(team, owner.user).jobs.get()
    Job.objects.filter(run=running).update(status=JobStatus.SUCCEEDED, cached_from=source)

    response = _grant(member, running)

    assert response.status_code == 409 and "served from the cache and never ran" in response.json()["message"]


def test_a_runner_that_cannot_relay_is_refused_naming_the_upgrade(team: Workspace, owner: Person) -> None:
    run = running_on_a_runner(team, owner, submit(team, owner.user), relay=0)

    response = _grant(owner, run)

    assert response.status_code == 409
    assert "upgrade trainyard-runner on that machine" in response.json()["message"]


def test_a_docker_job_is_refused_as_not_supported_yet(team: Workspace, owner: Person) -> None:
    run = running_on_a_runner(team, owner, submit(team, owner.user, "boxed", DOCKER))

    response = _grant(owner, run)

    assert response.status_code == 409 and "not supported yet" in response.json()["message"]


def test_a_viewer_is_refused_and_another_workspaces_run_is_not_found(
    running: Run, viewer: Person, outsider: Person
) -> None:
    theirs = _grant(outsider, running)
    own = outsider.client().post(
        f"/api/v1/workspaces/{outsider.user.username}/runs/{running.name}/sessions/",
        {"kind": "terminal"},
        format="json",
    )

    assert _grant(viewer, running).status_code == 403
    assert (theirs.status_code, own.status_code) == (404, 404)
    assert not AccessSession.objects.exists()


def test_a_port_session_names_a_port_and_other_kinds_none(running: Run, member: Person) -> None:
    assert _grant(member, running, port=None).status_code == 400
    assert _grant(member, running, port=70000).status_code == 400
    assert _grant(member, running, kind="terminal").status_code == 400


def test_sessions_past_the_caps_are_refused_with_429(running: Run, member: Person, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "SESSIONS_PER_USER": 2, "SESSIONS_PER_JOB": 2}
    first = [_grant(member, running).status_code for _ in range(3)]
    AccessSession.objects.filter(user=member.user).update(user=_other(member))

    per_job = _grant(member, running)

    assert first == [201, 201, 429]
    assert per_job.status_code == 429 and "the most one job may have" in per_job.json()["message"]


def test_the_apps_proxys_connections_are_capped_apart_from_a_persons_sessions(
    running: Run, member: Person, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "SESSIONS_PER_USER": 1, "APP_STREAMS_PER_USER": 2}
    app_streams = [_grant_as_app_proxy(member, running) for _ in range(3)]

    terminal = _grant(member, running, kind="terminal", port=None)
    second = _grant(member, running, kind="terminal", port=None)

    assert [type(g).__name__ for g in app_streams[:2]] == ["Grant", "Grant"]
    assert isinstance(app_streams[2], AccessRefused) and app_streams[2].status_code == 429
    assert "connections to jobs' web apps" in app_streams[2].message
    assert terminal.status_code == 201  # a browser tab's connections did not use up the person's sessions
    assert second.status_code == 429 and "1 live sessions" in second.json()["message"]


def _grant_as_app_proxy(member: Person, run: Run) -> Any:
    try:
        return grant_session(
            workspace=run.workspace, user=member.user, run=run, job_name=None, kind="port", port=8888,
            client_label=APP_PROXY,
        )  # fmt: skip
    except AccessRefused as refused:
        return refused


def _other(member: Person) -> Any:
    from backend.accounts.services import user_get_or_create

    return user_get_or_create(username="someone-else")


# ------------------------------------------------------------------ ends


def test_the_session_ends_when_its_attempt_ends_and_a_spot_notice_says_what_to_do(
    running: Run, member: Person, django_capture_on_commit_callbacks: Any
) -> None:
    grant = _grant(member, running).json()
    job = running.jobs.get()

    with django_capture_on_commit_callbacks(execute=True):
        report(job, job.instance_id, "interrupted", reason="spot interruption notice")

    session = AccessSession.objects.get(pk=grant["id"])
    assert (session.state, session.end_reason) == ("ended", SPOT_REASON)


def test_a_job_that_ends_ends_its_sessions(
    running: Run, member: Person, django_capture_on_commit_callbacks: Any
) -> None:
    grant = _grant(member, running).json()
    job = running.jobs.get()

    with django_capture_on_commit_callbacks(execute=True):
        report(job, job.instance_id, "succeeded", exit_code=0)

    session = AccessSession.objects.get(pk=grant["id"])
    assert (session.state, session.end_reason) == ("ended", "the job's commands ended: its session ends with them")


def test_an_admin_lists_every_session_and_ends_one_a_member_sees_only_their_own(
    running: Run, member: Person, owner: Person
) -> None:
    mine = _grant(member, running).json()["id"]
    theirs = _grant(owner, running).json()["id"]

    listed_by_member = [s["id"] for s in member.client().get("/api/v1/workspaces/acme/sessions/").json()]
    listed_by_admin = {s["id"] for s in owner.client().get("/api/v1/workspaces/acme/sessions/?live=1").json()}
    not_theirs = member.client().post(f"/api/v1/workspaces/acme/sessions/{theirs}/end/")
    ended = owner.client().post(f"/api/v1/workspaces/acme/sessions/{mine}/end/")

    assert listed_by_member == [mine] and listed_by_admin == {mine, theirs}
    assert not_theirs.status_code == 404
    assert ended.status_code == 200
    assert (ended.json()["state"], ended.json()["end_reason"]) == ("ended", "ended by an admin (olivia)")
    assert [s["id"] for s in owner.client().get("/api/v1/workspaces/acme/sessions/?live=1").json()] == [theirs]


def test_a_session_is_audited_at_its_start_and_its_end_with_its_bytes(running: Run, member: Person) -> None:
    grant = _grant(member, running).json()
    attached = client_attach(session_id=grant["id"], token=grant["token"], user=None, channel="c", address="10.0.0.9")
    AccessSession.objects.filter(pk=grant["id"]).update(bytes_up=12, bytes_down=345)

    end_detach(session_id=grant["id"], side="client", channel="c")

    events = AuditEvent.objects.filter(kind="session").order_by("created_at")
    assert attached.refusal_code == 0
    assert [e.action for e in events] == ["session.start", "session.end"]
    end = events.last()
    assert end is not None and (end.username, end.address, end.target) == ("mateo", "10.0.0.9", f"{running.name}/hello")
    assert (end.detail["bytes_up"], end.detail["bytes_down"], end.detail["reason"]) == (
        12, 345, "the client closed the session"
    )  # fmt: skip


def test_a_client_with_a_wrong_token_or_after_the_grant_expired_is_refused(running: Run, member: Person) -> None:
    grant = _grant(member, running).json()
    wrong = client_attach(session_id=grant["id"], token="tyses_wrong", user=None, channel="c")
    someone = client_attach(session_id=grant["id"], token="", user=_other(member), channel="c")
    AccessSession.objects.filter(pk=grant["id"]).update(grant_expires_at=timezone.now())
    late = client_attach(session_id=grant["id"], token=grant["token"], user=None, channel="c")

    assert (wrong.refusal_code, someone.refusal_code, late.refusal_code) == (4401, 4401, 4404)
    assert AccessSession.objects.get(pk=grant["id"]).state == SessionState.ENDED


def test_a_terminals_client_back_before_its_old_socket_dropped_takes_over(running: Run, member: Person) -> None:
    terminal = _grant(member, running, kind="terminal", port=None).json()
    port = _grant(member, running).json()
    attach = {"user": None, "address": "10.0.0.9"}
    for grant in (terminal, port):
        assert client_attach(session_id=grant["id"], token=grant["token"], channel="old", **attach).refusal_code == 0

    again = client_attach(session_id=terminal["id"], token=terminal["token"], channel="new", **attach)
    second = client_attach(session_id=port["id"], token=port["token"], channel="new", **attach)
    end_detach(session_id=terminal["id"], side="client", channel="old")  # the old socket's end, later

    assert (again.refusal_code, second.refusal_code) == (0, 4403)
    session = AccessSession.objects.get(pk=terminal["id"])
    assert (session.state, session.client_channel) == ("open", "new")


# ------------------------------------------------------------------ the sweep


def test_the_sweep_ends_unused_grants_lost_terminals_and_idle_sessions(
    running: Run, member: Person, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "SESSION_IDLE_SECONDS": 60, "TERMINAL_GRACE": 30}
    unused, lost, idle, busy = (_grant(member, running).json()["id"] for _ in range(4))
    long_ago = timezone.now() - timedelta(minutes=5)
    AccessSession.objects.filter(pk=unused).update(grant_expires_at=long_ago)
    AccessSession.objects.filter(pk=lost).update(state="detached", kind="terminal", port=None, detached_at=long_ago)
    AccessSession.objects.filter(pk=idle).update(state="open", started_at=long_ago, last_activity_at=long_ago)
    AccessSession.objects.filter(pk=busy).update(state="open", started_at=long_ago, last_activity_at=timezone.now())

    ended = sessions_sweep()

    reasons = dict(AccessSession.objects.filter(state="ended").values_list("pk", "end_reason"))
    assert ended == 3
    assert {str(k): v for k, v in reasons.items()} == {
        unused: "the grant expired before a client connected",
        lost: "the terminal's client did not come back within 30 s",
        idle: "idle for 60 s: no byte either way",
    }
    assert AccessSession.objects.get(pk=busy).state == "open"

"""A dev environment's job as the server keeps it: its token (made per job,
encrypted at rest, fetched by its runner as ``JUPYTER_TOKEN``, masked in its
log, never in the assignment), its ssh-config host, and no cache."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from trainyard_spec import Source

from backend.accounts.models import Workspace
from backend.runs.lifecycle.devenvs import app_port, app_request_headers_of, app_token, dev_environment_of
from backend.runs.models import Job, Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.devenvs import dev_environment_active
from backend.runs.services.logs import logs_store
from backend.runs.services.runs import CodeInput, PlanInputs, run_create, run_rerun
from tests.support.attempts import accept, assign_frame, runner_get
from tests.support.fixtures import Person
from tests.support.runners import runner_instance

WORKFLOWS = """\
workflows:
  - name: lab
    provider: lab
    artifacts: [./notebooks]
    inactivity_duration: 2h
  - name: ide
    provider: code
"""
RUNNER = "runner-token-of-d"


def _submit(team: Workspace, owner: Person, workflow: str = "lab") -> Run:
    return run_create(
        workspace=team,
        user=owner.user,
        workflow=workflow,
        inputs=PlanInputs(files=(Source(".trainyard/workflows.yaml", WORKFLOWS),)),
        code=CodeInput(kind="git", repo_url="https://example.com/acme/models.git", commit="a" * 40),
    )


def test_a_lab_job_gets_its_own_token_encrypted_at_rest_fetched_by_its_runner_and_masked(
    team: Workspace, owner: Person
) -> None:
    run = _submit(team, owner)
    instance = runner_instance(team, "d", RUNNER, channel_name="c-d")
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)
    token = app_token(job)
    frame = assign_frame(job)
    fetched = runner_get(job, RUNNER, "secrets")
    stored = logs_store(
        job_id=str(job.pk),
        instance_id=str(instance.pk),
        attempt=1,
        first_seq=1,
        lines=[(1.0, "o", f"http://127.0.0.1:8888/lab?token={token}")],
    )
    again = run_rerun(run=run, user=owner.user).jobs.get()

    assert len(token) >= 40
    assert token.encode() not in bytes(Job.objects.get(pk=job.pk).app_token)
    assert token not in frame.model_dump_json() and frame.secrets is True
    assert frame.env["TRAINYARD_SSH_HOST"] == f"trainyard-{run.name}"
    assert fetched.status_code == 200
    assert fetched.json()["env"] == {"JUPYTER_TOKEN": token}
    assert [line[2] for line in stored.new_lines] == ["http://127.0.0.1:8888/lab?token=*****"]
    assert app_token(again) not in ("", token)


def test_a_lab_job_is_a_dev_environment_served_on_its_first_port_and_never_reused(
    team: Workspace, owner: Person
) -> None:
    run = _submit(team, owner)
    job = run.jobs.get()
    Job.objects.filter(pk=job.pk).update(ports=[40001])
    job.refresh_from_db()

    found = dev_environment_of(job.spec)

    assert found is not None
    assert (found.kind, found.inactivity_seconds, found.idle_words(), app_port(job)) == ("lab", 7200, "2h", 40001)
    assert job.cache_decision is not None
    assert job.cache_decision["text"] == "runs: never reused (a dev environment)"


def test_a_code_job_has_no_token_and_the_workspaces_default_idle_time(team: Workspace, owner: Person) -> None:
    job = _submit(team, owner, "ide").jobs.get()

    found = dev_environment_of(job.spec)

    assert job.app_token is None and app_token(job) == "" and app_port(job) is None
    assert found is not None and (found.kind, found.inactivity_seconds) == ("code", 3600)


def test_the_app_proxy_sends_the_token_to_the_jupyter_port_only(team: Workspace, owner: Person) -> None:
    lab = _submit(team, owner).jobs.get()
    ide = _submit(team, owner, "ide").jobs.get()
    Job.objects.filter(pk__in=[lab.pk, ide.pk]).update(ports=[40001, 40002])
    lab.refresh_from_db()
    ide.refresh_from_db()

    assert app_request_headers_of(lab, 40001) == {"Authorization": f"token {app_token(lab)}"}
    assert app_request_headers_of(lab, 40002) == {}
    assert app_request_headers_of(ide, 40001) == {}


def test_the_runners_report_of_jupyter_activity_moves_the_jobs_activity_forward_only(
    team: Workspace, owner: Person
) -> None:
    run = _submit(team, owner)
    instance = runner_instance(team, "d", RUNNER, channel_name="c-d")
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)

    assert dev_environment_active(instance_id=instance.pk, idle_seconds=60) == 1
    first = Job.objects.get(pk=job.pk).app_active_at
    assert dev_environment_active(instance_id=instance.pk, idle_seconds=600) == 0
    assert dev_environment_active(instance_id=instance.pk, idle_seconds=0) == 1
    latest = Job.objects.get(pk=job.pk).app_active_at

    assert first is not None and latest is not None
    assert timedelta(seconds=55) < latest - first < timedelta(seconds=65)
    assert abs(timezone.now() - latest) < timedelta(seconds=5)

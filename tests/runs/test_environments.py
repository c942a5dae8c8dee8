"""The environments a workspace's runners report (backend/runs/services/environments.py)
and the API that shows them: one row per workspace and key, only from the
runner holding the attempt, never visible to another workspace."""

from __future__ import annotations

from django.db import transaction
from rest_framework.test import APIClient
from trainyard_runner.protocol import EnvironmentReport

from backend.accounts.models import Workspace
from backend.clouds.services.selfhosted import Registered, registration_token_create, runner_register
from backend.runs.models import Attempt, Environment, Job
from backend.runs.services.environments import environment_record
from backend.runs.services.transitions import job_assign
from tests.support.fixtures import Person, submit

KEY = "0123456789abcdef01234567"
LOCK = "tinypkg==1.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"


def report(**changes: object) -> EnvironmentReport:
    values: dict[str, object] = {
        "key": KEY, "built": True, "build_seconds": 2.5, "size_bytes": 4096, "lock": LOCK,
        "packages": "tinypkg==1.0\n", "platform": {"python": "3.11.7", "abi": "cpython-311"},
    }  # fmt: skip
    return EnvironmentReport.model_validate({**values, **changes})


def running_job(workspace: Workspace, person: Person, name: str = "box") -> tuple[Job, Registered]:
    job = submit(workspace, person.user).jobs.get()
    runner = runner_register(token=registration_token_create(workspace=workspace, user=person.user).token, name=name)
    with transaction.atomic():
        job_assign(job=Job.objects.select_for_update().get(pk=job.pk), instance=runner.instance)
    return job, runner


def client(person: Person) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {person.token}")
    return api


def test_the_first_report_is_kept_and_later_ones_only_mark_it_used(team: Workspace, owner: Person) -> None:
    job, runner = running_job(team, owner)
    instance = str(runner.instance.pk)
    assert environment_record(job_id=str(job.pk), instance_id=instance, attempt=1, report=report())
    first = Environment.objects.get(workspace=team, key=KEY)
    assert (first.lock, first.build_seconds, first.size_bytes, first.built_on) == (LOCK, 2.5, 4096, "box")

    assert environment_record(
        job_id=str(job.pk), instance_id=instance, attempt=1, report=report(built=False, build_seconds=9.0, lock="x")
    )
    again = Environment.objects.get(workspace=team, key=KEY)
    assert (again.lock, again.build_seconds) == (LOCK, 2.5) and again.last_used_at > first.last_used_at
    assert Attempt.objects.get(job=job, number=1).environment_key == KEY


def test_a_runner_that_does_not_hold_the_attempt_records_nothing(team: Workspace, owner: Person) -> None:
    job, _ = running_job(team, owner)
    _, other = running_job(team, owner, name="other")
    assert not environment_record(job_id=str(job.pk), instance_id=str(other.instance.pk), attempt=1, report=report())
    assert not environment_record(job_id=str(job.pk), instance_id=str(other.instance.pk), attempt=2, report=report())
    assert not Environment.objects.exists()
    assert Attempt.objects.get(job=job, number=1).environment_key == ""


def test_the_api_lists_shows_and_serves_the_lock_within_the_workspace_only(
    team: Workspace, owner: Person, outsider: Person
) -> None:
    job, runner = running_job(team, owner)
    environment_record(job_id=str(job.pk), instance_id=str(runner.instance.pk), attempt=1, report=report())
    theirs, their_runner = running_job(outsider.user.personal_workspace, outsider)
    environment_record(
        job_id=str(theirs.pk), instance_id=str(their_runner.instance.pk), attempt=1, report=report(lock="theirs\n")
    )
    base = f"/api/v1/workspaces/{team.slug}/environments/"

    listed = client(owner).get(base).json()
    assert [(e["key"], e["runs"], e["packages"], e["built_on"]) for e in listed] == [(KEY, 1, 1, "box")]
    detail = client(owner).get(f"{base}{KEY}/").json()
    assert (detail["lock"], detail["installed"], detail["recent_runs"]) == (LOCK, "tinypkg==1.0\n", [job.run.name])
    lock = client(owner).get(f"{base}{KEY}/lock")
    assert (lock.status_code, lock.content.decode(), lock["Content-Disposition"]) == (
        200,
        LOCK,
        f'attachment; filename="environment-{KEY}.lock.txt"',
    )
    run = client(owner).get(f"/api/v1/workspaces/{team.slug}/runs/{job.run.name}/").json()
    assert run["jobs"][0]["attempts"][0]["environment"] == KEY

    # The outsider's own environment of the same key holds their lock, not ours.
    mine = client(outsider).get(f"/api/v1/workspaces/{outsider.user.personal_workspace.slug}/environments/{KEY}/lock")
    assert mine.content.decode() == "theirs\n"
    assert client(outsider).get(f"{base}{KEY}/lock").status_code == 404
    assert (
        client(owner).get(f"{base}{'f' * 24}/").json()["message"]
        == f"Environment {'f' * 24!r} not found in this workspace."
    )

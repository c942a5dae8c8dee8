"""The environments a workspace's runners report (backend/runs/services/environments.py)
and the API that shows them: one row per workspace and key, only from the
runner holding the attempt, never visible to another workspace."""

from __future__ import annotations

import pytest
from django.db import transaction
from rest_framework.test import APIClient
from trainyard_runner.protocol import EnvironmentReport
from trainyard_spec.environments import recipe_of

from backend.accounts.models import Workspace
from backend.clouds.services.selfhosted import Registered, registration_token_create, runner_register
from backend.core.errors import ApplicationError
from backend.runs.lifecycle.cachewhy import Reason, ReasonKind, _spec_reasons
from backend.runs.lifecycle.dag import cache_key
from backend.runs.lifecycle.transitions import job_assign
from backend.runs.models import Attempt, Environment, EnvironmentArchive, Job
from backend.runs.services.environments import environment_outlook, environment_record
from backend.runs.services.runs import CodeInput, plan_inputs, run_create
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


# ------------------------------------------------------------ before a job runs

ENV_WORKFLOWS = """workflows:
  - name: prep
    provider: bash
    commands: [echo prep > data.txt]
    artifacts: [data.txt]
  - name: train
    provider: bash
    deps: [{workflow: prep}]
    environment: {python: "3.11", requirements: requirements.txt}
    commands: [python train.py]
    artifacts: [model]
"""
REQUIREMENTS = {"requirements.txt": {"requirements.txt": "1" * 64, "base.txt": "2" * 64}}


def submit_train(workspace: Workspace, person: Person, files: dict[str, dict[str, str]], **extra: object) -> Job:
    run = run_create(
        workspace=workspace,
        user=person.user,
        workflow="train",
        inputs=plan_inputs(
            files=[{"path": ".trainyard/workflows.yaml", "text": ENV_WORKFLOWS}], env={}, environment_files=files
        ),
        code=CodeInput(kind="git", repo_url="https://example.com/acme/models.git", commit="a" * 40),
        **extra,  # type: ignore[arg-type]
    )
    return run.jobs.get(name="train") if not run.environment_build else run.jobs.get()


def test_the_environments_file_digests_are_part_of_the_jobs_spec_and_a_change_is_named(
    team: Workspace, owner: Person
) -> None:
    first = submit_train(team, owner, REQUIREMENTS)
    assert first.spec["environment_files"] == REQUIREMENTS["requirements.txt"]
    assert first.run.environment_files == REQUIREMENTS
    changed = {"requirements.txt": {**REQUIREMENTS["requirements.txt"], "base.txt": "3" * 64}}
    second = submit_train(team, owner, changed)
    # The digests are part of the cache key: same code, a changed included file, a miss.
    assert cache_key(spec=second.spec, code="git:x", inputs=[]) != cache_key(spec=first.spec, code="git:x", inputs=[])
    old, new = first.spec, second.spec
    assert _spec_reasons(old, new) == [Reason(ReasonKind.ENVIRONMENT_CHANGED, "environment changed (base.txt)")]
    pip = {**new, "environment": {**new["environment"], "pip": ["torch"]}}
    assert _spec_reasons(new, pip) == [Reason(ReasonKind.ENVIRONMENT_CHANGED, "environment changed (pip)")]
    unknown = {k: v for k, v in new.items() if k != "environment_files"}
    assert _spec_reasons(unknown, new) == [
        Reason(
            ReasonKind.ENVIRONMENT_CHANGED, "environment changed (requirements.txt (its digest was not sent before))"
        )
    ]


def test_an_environment_build_is_one_job_per_environment_without_commands_or_inputs(
    team: Workspace, owner: Person
) -> None:
    job = submit_train(team, owner, REQUIREMENTS, environment_build=True)
    assert job.run.environment_build and job.name == "train"
    assert (job.spec["commands"], job.spec["artifacts"], job.input_refs) == ([], [], [])
    assert job.spec["environment"] == {"python": "3.11", "requirements": "requirements.txt"}
    assert not job.needs.exists()

    with pytest.raises(ApplicationError, match="workflow 'prep' has no environment: nothing to build"):
        run_create(
            workspace=team,
            user=owner.user,
            workflow="prep",
            inputs=plan_inputs(files=[{"path": ".trainyard/workflows.yaml", "text": ENV_WORKFLOWS}], env={}),
            code=CodeInput(kind="git", repo_url="https://example.com/acme/models.git", commit="a" * 40),
            environment_build=True,
        )


def test_the_outlook_finds_an_environment_by_its_recipe_in_this_workspace_only(
    team: Workspace, owner: Person, outsider: Person
) -> None:
    other = outsider.user.personal_workspace
    environment = {"python": "3.11", "requirements": "requirements.txt"}
    files = REQUIREMENTS["requirements.txt"]
    outlook = environment_outlook(workspace_id=team.pk, workflow="train", environment=environment, files=files)
    assert outlook == {"state": "to build", "key": "", "built_on": "", "stored": False, "build_seconds": None}
    assert environment_outlook(workspace_id=team.pk, workflow="train", environment=None, files=None) is None
    assert (
        environment_outlook(workspace_id=team.pk, workflow="train", environment=environment, files=None)["state"]
        == "unknown"
    )

    job, runner = running_job(team, owner)
    Job.objects.filter(pk=job.pk).update(workflow="train")
    recipe = recipe_of(environment, files)
    assert environment_record(
        job_id=str(job.pk), instance_id=str(runner.instance.pk), attempt=1, report=report(recipe=recipe)
    )
    ready = environment_outlook(workspace_id=team.pk, workflow="train", environment=environment, files=files)
    assert ready == {"state": "ready", "key": KEY, "built_on": "box", "stored": False, "build_seconds": 2.5}
    EnvironmentArchive.objects.create(workspace=team, key=KEY, storage_key="k", size=1, complete=True)
    stored = environment_outlook(workspace_id=team.pk, workflow="train", environment=environment, files=files)
    assert stored is not None and stored["stored"] is True

    # Another recipe of the same workflow: to build, saying how long the last build took.
    changed = {**files, "base.txt": "3" * 64}
    again = environment_outlook(workspace_id=team.pk, workflow="train", environment=environment, files=changed)
    assert again == {"state": "to build", "key": "", "built_on": "", "stored": False, "build_seconds": 2.5}
    # Another workspace with the very same recipe has built nothing.
    theirs = environment_outlook(workspace_id=other.pk, workflow="train", environment=environment, files=files)
    assert theirs is not None and theirs["state"] == "to build" and theirs["build_seconds"] is None


def test_a_packed_environment_is_restored_only_by_jobs_of_the_repository_that_packed_it(
    team: Workspace, owner: Person, member: Person, settings: object, tmp_path: object
) -> None:
    import hashlib

    from backend.artifacts.storage import get_storage
    from backend.runs.services.environments import (
        environment_archive_begin,
        environment_archive_done,
        environment_archive_find,
    )

    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}  # type: ignore[attr-defined]

    def job_of(person: Person, repo_url: str) -> Job:
        return run_create(
            workspace=team,
            user=person.user,
            workflow="hello",
            workflows_file_path=".trainyard/workflows.yaml",
            workflows_file_text=submit(team, person.user).workflows_file_text,
            code=CodeInput(kind="git", repo_url=repo_url, commit="b" * 40),
            env={},
        ).jobs.get()

    theirs = job_of(member, "https://example.com/mallory/other.git")
    packed = b"a packed environment"
    digest = hashlib.sha256(packed).hexdigest()
    assert environment_archive_begin(job=theirs, key=KEY, size=len(packed), sha256=digest) is not None
    row = EnvironmentArchive.objects.get()
    get_storage().write(row.storage_key, iter([packed]))
    assert environment_archive_done(job=theirs, key=KEY) == ""

    ours = job_of(owner, "https://example.com/acme/models.git")
    assert environment_archive_find(job=ours, key=KEY) is None
    assert environment_archive_find(job=job_of(member, "https://example.com/mallory/other.git"), key=KEY) is not None
    assert (row.saved_by, row.saved_by_job) == (member.user, theirs)

    # Ours packs its own under the same key: a row of its own, the other repository's stays.
    assert environment_archive_begin(job=ours, key=KEY, size=len(packed), sha256=digest) is not None
    assert EnvironmentArchive.objects.filter(key=KEY).count() == 2

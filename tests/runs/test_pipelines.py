"""DAGs, inputs, the cache and tags, at the service level (real Postgres)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.artifacts.models import Artifact, ArtifactFile
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete
from backend.artifacts.storage import get_storage
from backend.clouds.models import Instance, InstanceStatus
from backend.core.errors import ApplicationError
from backend.core.tokens import hash_token
from backend.runs.lifecycle.cachewhy import _spec_reasons
from backend.runs.lifecycle.dag import cache_key
from backend.runs.models import Job, JobStatus, Run, RunStatus
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.tags import tag_set
from tests.support.attempts import accept, assign_frame, report, runner_get
from tests.support.fixtures import Person, submit


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}


def _runner(team: Workspace) -> Instance:
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name="local-t",
        token_hash=hash_token("runner-token"),
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**30,
        channel_name="test-channel",
        address="127.0.0.1",
    )


def _run_job(job: Job, instance: Instance, files: dict[str, bytes], *, exit_code: int = 0) -> None:
    """What a runner does: accept, upload the artifact's files, report."""
    job.refresh_from_db()
    assert accept(job, instance.pk)
    for path in job.spec["artifacts"]:
        manifest = [FileIn(name, len(data), hashlib.sha256(data).hexdigest()) for name, data in files.items()]
        artifact, _ = artifact_begin(job=job, path=path, files=manifest)
        for name, data in files.items():
            get_storage().write(f"{artifact.storage_prefix}/{name}", iter([data]))
        artifact_complete(artifact=artifact)
    report(job, instance.pk, "succeeded" if exit_code == 0 else "failed", exit_code)
    Instance.objects.filter(pk=instance.pk).update(status=InstanceStatus.IDLE)


def test_a_dependency_becomes_a_job_of_the_same_run(team: Workspace, owner: Person) -> None:
    run = submit(team, owner.user, workflow="train")
    hello, train = run.jobs.order_by("created_at")
    assert (hello.name, train.name) == ("hello", "train")
    assert list(train.needs.all()) == [hello]


def test_the_dependent_waits_then_gets_the_artifacts_as_inputs(team: Workspace, owner: Person) -> None:
    instance = _runner(team)
    run = submit(team, owner.user, workflow="train")
    hello, train = run.jobs.order_by("created_at")

    jobs_schedule()
    train.refresh_from_db()
    assert train.status == JobStatus.PENDING and train.status_reason == "waiting for hello to finish"

    _run_job(hello, instance, {"w.bin": b"weights"})
    jobs_schedule()
    train.refresh_from_db()
    frame = assign_frame(train)

    assert train.status == JobStatus.ASSIGNED
    page = runner_get(train, "runner-token", "inputs", path="./out").json()

    assert [(i.path, i.file_count, i.files) for i in frame.inputs] == [("./out", 1, [])]
    assert [(f["path"], f["size"]) for f in page["files"]] == [("w.bin", 7)] and page["next"] == ""
    assert frame.env["TRAINYARD_JOB_NAME"] == "train"


def test_an_inputs_files_are_read_page_by_page_and_the_assignment_names_only_their_count(
    team: Workspace, owner: Person, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "INPUT_PAGE_FILES": 1000}
    instance = _runner(team)
    run = submit(team, owner.user, workflow="train")
    hello, train = run.jobs.order_by("created_at")
    jobs_schedule()
    _run_job(hello, instance, {"w.bin": b"weights"})
    artifact = Artifact.objects.get(job=hello)
    sha = hashlib.sha256(b"weights").hexdigest()
    ArtifactFile.objects.bulk_create(
        ArtifactFile(
            artifact=artifact, path=f"many/{i:05}.bin", size=7, sha256=sha, key=f"{artifact.storage_prefix}/w.bin"
        )
        for i in range(2500)
    )
    jobs_schedule()

    frame = assign_frame(train)
    pages, after = [], ""
    while True:
        page = runner_get(train, "runner-token", "inputs", path="./out", **({"after": after} if after else {})).json()
        pages.append(page)
        after = page["next"]
        if not after:
            break
    missing = runner_get(train, "runner-token", "inputs", path="./elsewhere")

    paths = [f["path"] for page in pages for f in page["files"]]
    assert [(i.path, i.file_count) for i in frame.inputs] == [("./out", 2501)]
    assert len(frame.model_dump_json()) < 4096
    assert [len(page["files"]) for page in pages] == [1000, 1000, 501]
    assert paths == sorted(paths) and len(set(paths)) == 2501 and "w.bin" in paths
    assert (missing.status_code, missing.json()["message"]) == (404, "'./elsewhere' is not an input of this job.")


def test_a_failed_dependency_fails_the_dependent_with_a_reason(team: Workspace, owner: Person) -> None:
    instance = _runner(team)
    run = submit(team, owner.user, workflow="train")
    hello, train = run.jobs.order_by("created_at")
    jobs_schedule()
    _run_job(hello, instance, {}, exit_code=2)

    jobs_schedule()
    train.refresh_from_db()
    run.refresh_from_db()

    assert (train.status, train.status_reason) == (JobStatus.FAILED, "dependency hello failed")
    assert (run.status, run.exit_code) == (RunStatus.FAILED, 2)


def test_an_identical_job_is_reused_from_cache_and_no_cache_forces_a_run(team: Workspace, owner: Person) -> None:
    instance = _runner(team)
    first = submit(team, owner.user, workflow="hello")
    jobs_schedule()
    _run_job(first.jobs.get(), instance, {"w.bin": b"weights"})

    again = submit(team, owner.user, workflow="train")
    jobs_schedule()
    hello, train = again.jobs.order_by("created_at")
    hello.refresh_from_db()
    train.refresh_from_db()

    assert hello.status == JobStatus.SUCCEEDED and hello.cached_from_id == first.jobs.get().pk
    assert hello.status_reason == f"reused from {first.name} (cached)"
    assert train.status == JobStatus.ASSIGNED  # its inputs come from the cached job
    page = runner_get(train, "runner-token", "inputs", path="./out").json()
    assert [f["sha256"] for f in page["files"]] == [hashlib.sha256(b"weights").hexdigest()]

    Instance.objects.filter(pk=instance.pk).update(status=InstanceStatus.IDLE)
    forced = submit(team, owner.user, workflow="hello", no_cache=True)
    jobs_schedule()
    assert forced.jobs.get().cached_from_id is None
    assert forced.jobs.get().status == JobStatus.ASSIGNED


def test_declaring_metrics_keeps_the_cache_key_and_is_no_reason_for_a_miss() -> None:
    """Metric patterns read a job's log; they change nothing it makes."""
    spec: dict[str, object] = {"commands": ["python train.py"], "artifacts": [{"path": "./model"}]}
    watched = {**spec, "metrics": {"patterns": [{"name": "loss", "regex": "loss ([0-9.]+)"}]}}
    changed = {**spec, "commands": ["python train.py --fast"]}

    assert cache_key(spec=watched, code="git:abc+", inputs=[]) == cache_key(spec=spec, code="git:abc+", inputs=[])
    assert cache_key(spec=changed, code="git:abc+", inputs=[]) != cache_key(spec=spec, code="git:abc+", inputs=[])
    assert _spec_reasons(spec, watched) == []


def test_other_code_is_not_a_cache_hit(team: Workspace, owner: Person) -> None:
    instance = _runner(team)
    first = submit(team, owner.user, workflow="hello")
    jobs_schedule()
    _run_job(first.jobs.get(), instance, {"w.bin": b"weights"})
    other = submit(team, owner.user, workflow="hello", commit="b" * 40)
    jobs_schedule()

    assert other.jobs.get().cached_from_id is None


def test_tags_point_at_successful_runs_and_move_only_with_force(team: Workspace, owner: Person) -> None:
    instance = _runner(team)
    good = submit(team, owner.user)
    jobs_schedule()
    _run_job(good.jobs.get(), instance, {"w.bin": b"w"})
    other = submit(team, owner.user)
    jobs_schedule()  # identical: succeeds from the cache, and is taggable like any success
    failed = submit(team, owner.user)
    Run.objects.filter(pk=failed.pk).update(status=RunStatus.FAILED)
    for run in (good, other, failed):
        run.refresh_from_db()

    _, outcome = tag_set(workspace=team, user=owner.user, name="best", run=good, force=False)
    with pytest.raises(ApplicationError) as conflict:
        tag_set(workspace=team, user=owner.user, name="best", run=other, force=False)
    with pytest.raises(ApplicationError) as not_ok:
        tag_set(workspace=team, user=owner.user, name="worse", run=failed, force=False)
    moved, how = tag_set(workspace=team, user=owner.user, name="best", run=other, force=True)

    assert outcome == "created" and how == "moved" and moved.run_id == other.pk
    assert conflict.value.status_code == 409 and "use force" in conflict.value.message
    assert "only a successful run can be tagged" in not_ok.value.message


def test_a_tag_dependency_uses_the_tagged_runs_artifacts(team: Workspace, owner: Person) -> None:
    instance = _runner(team)
    source = submit(team, owner.user, workflow="train")
    jobs_schedule()
    hello, train = source.jobs.order_by("created_at")
    _run_job(hello, instance, {"w.bin": b"w"})
    jobs_schedule()
    Job.objects.filter(pk=train.pk).update(spec={**train.spec, "artifacts": ["./model"]})
    _run_job(train, instance, {"m.bin": b"model"})
    source.refresh_from_db()
    tag_set(workspace=team, user=owner.user, name="best", run=source, force=False)

    evaluate = submit(team, owner.user, workflow="evaluate").jobs.get()
    jobs_schedule()
    evaluate.refresh_from_db()

    paths = sorted(i.path for i in assign_frame(evaluate).inputs)
    assert paths == ["./model", "./out"]
    assert evaluate.input_refs[0]["run_name"] == source.name


def test_an_unknown_tag_is_refused_before_anything_is_written(team: Workspace, owner: Person) -> None:
    with pytest.raises(ApplicationError) as caught:
        submit(team, owner.user, workflow="evaluate")
    assert "tag 'best' does not exist" in caught.value.message
    assert Run.objects.count() == 0 and Artifact.objects.count() == 0

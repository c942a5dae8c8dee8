"""A run's data inputs from submission to the runner (moto's S3 over HTTP,
real Postgres): listed once when the run is submitted, refused with the
workflow's file, line and key, part of each job's cache key, handed to the
runner page by page, and shown by the dry run."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from rest_framework.test import APIClient

from backend.accounts.models import Workspace
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete
from backend.artifacts.storage import get_storage
from backend.clouds.models import Instance, InstanceStatus
from backend.clouds.services.instances import instance_heartbeat
from backend.core.errors import ApplicationError
from backend.core.tokens import hash_token
from backend.data.models import DataSnapshot
from backend.data.services import data_endpoint_set
from backend.runs.models import Job, JobStatus, Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.runs import run_rerun
from tests.support.attempts import accept, assign_frame, job_credential, report, runner_get
from tests.support.aws_account import admin
from tests.support.fixtures import Person, submit
from tests.support.moto import MotoServer

DATA = "acme-data"
URI = f"s3://{DATA}/imagenet/"
WORKFLOWS = f"""\
workflows:
  - name: train
    provider: bash
    commands: [python train.py]
    artifacts: [./model]
    inputs:
      - {URI}
      - uri: s3://{DATA}/labels.txt
        path: ./meta/labels.txt
"""


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}


@pytest.fixture
def s3(aws: MotoServer, team: Workspace) -> Any:
    """The workspace reads acme-data through its S3-compatible endpoint (moto), 200 objects under imagenet/."""
    data_endpoint_set(
        workspace=team, endpoint_url=aws.url, region="us-east-1", access_key_id="testing", secret_access_key="testing"
    )
    client = admin(aws, "s3")
    client.create_bucket(Bucket=DATA)
    for i in range(200):
        client.put_object(Bucket=DATA, Key=f"imagenet/train/{i:04d}.bin", Body=f"sample {i}".encode())
    client.put_object(Bucket=DATA, Key="labels.txt", Body=b"cat\ndog\n")
    return client


def _runner(team: Workspace, name: str = "local-t", token: str = "runner-token") -> Instance:
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name=name,
        token_hash=hash_token(token),
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**30,
        channel_name=f"channel-{name}",
        address="127.0.0.1",
    )


def _run_job(job: Job, instance: Instance) -> None:
    job.refresh_from_db()
    assert accept(job, instance.pk)
    for path in job.spec["artifacts"]:
        artifact, _ = artifact_begin(job=job, path=path, files=[FileIn("m.bin", 1, hashlib.sha256(b"m").hexdigest())])
        get_storage().write(f"{artifact.storage_prefix}/m.bin", iter([b"m"]))
        artifact_complete(artifact=artifact)
    report(job, instance.pk, "succeeded", 0)
    Instance.objects.filter(pk=instance.pk).update(status=InstanceStatus.IDLE)


def _submit(team: Workspace, owner: Person, text: str = WORKFLOWS) -> Run:
    return submit(team, owner.user, workflow="train", text=text)


def test_the_submission_lists_each_input_once_and_the_assignment_names_its_snapshot(
    s3: Any, team: Workspace, owner: Person
) -> None:
    instance = _runner(team)
    run = _submit(team, owner)
    job = run.jobs.get()
    jobs_schedule()

    frame = assign_frame(job)

    assert [(d.uri, d.path, d.file_count, d.read_only) for d in frame.data] == [
        (URI, "imagenet", 200, True),
        (f"s3://{DATA}/labels.txt", "meta/labels.txt", 1, True),
    ]
    assert frame.data[0].total_size == sum(len(f"sample {i}") for i in range(200))
    assert [d.snapshot for d in frame.data] == [d["snapshot"] for d in job.spec["data"]]
    assert DataSnapshot.objects.filter(workspace=team).count() == 2
    page = runner_get(job, "runner-token", "data", path="imagenet").json()
    assert len(page["files"]) == 200 and page["next"] == ""
    assert page["files"][0]["path"] == "train/0000.bin"
    one = runner_get(job, "runner-token", "data", path="meta/labels.txt").json()
    assert [(f["path"], f["size"]) for f in one["files"]] == [("", 8)]
    import urllib.request

    with urllib.request.urlopen(one["files"][0]["url"], timeout=10) as answer:
        assert answer.read() == b"cat\ndog\n"
    assert instance.pk


def test_the_runner_pages_through_1000_files_at_a_time_and_asks_for_a_fresh_url(
    s3: Any, team: Workspace, owner: Person
) -> None:
    for i in range(200, 1005):
        s3.put_object(Bucket=DATA, Key=f"imagenet/train/{i:04d}.bin", Body=b"x")
    _runner(team)
    run = _submit(team, owner)
    job = run.jobs.get()
    jobs_schedule()

    first = runner_get(job, "runner-token", "data", path="imagenet").json()
    second = runner_get(job, "runner-token", "data", path="imagenet", after=first["next"]).json()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {job_credential('runner-token', job)}")
    fresh = client.post(
        f"/api/v1/runner/jobs/{job.pk}/data/url/?attempt={job.attempt}",
        {"path": "imagenet", "file": "train/0007.bin"},
        format="json",
    )
    unknown = client.post(
        f"/api/v1/runner/jobs/{job.pk}/data/url/?attempt={job.attempt}",
        {"path": "imagenet", "file": "train/nope.bin"},
        format="json",
    )
    elsewhere = runner_get(job, "runner-token", "data", path="elsewhere")

    assert (len(first["files"]), first["next"]) == (1000, "train/0999.bin")
    assert (len(second["files"]), second["next"]) == (5, "")
    assert fresh.status_code == 200 and "imagenet/train/0007.bin" in fresh.json()["url"]
    assert unknown.status_code == 404
    assert elsewhere.status_code == 404


def test_only_the_runner_holding_the_job_reads_its_data(s3: Any, team: Workspace, owner: Person) -> None:
    _runner(team)
    other = _runner(team, "local-u", "other-token")
    run = _submit(team, owner)
    job = run.jobs.get()
    jobs_schedule()

    answer = runner_get(job, "other-token", "data", path="imagenet")

    assert answer.status_code in (403, 404)
    assert other.pk


def test_an_unreadable_input_is_named_at_its_line_and_no_run_is_written(
    aws: MotoServer, team: Workspace, owner: Person
) -> None:
    data_endpoint_set(
        workspace=team, endpoint_url=aws.url, region="us-east-1", access_key_id="testing", secret_access_key="testing"
    )
    admin(aws, "s3").create_bucket(Bucket=DATA)
    admin(aws, "s3").put_object(Bucket=DATA, Key="labels.txt", Body=b"x")

    with pytest.raises(ApplicationError) as raised:
        _submit(team, owner)

    assert raised.value.message.startswith(
        f".trainyard/workflows.yaml:7: workflows[0] (train).inputs[0]: input {URI}: no object is stored under"
    )
    assert raised.value.extra["errors"][0]["line"] == 7
    assert not Run.objects.filter(workspace=team).exists()
    assert not DataSnapshot.objects.filter(workspace=team).exists()


def test_inputs_larger_than_the_jobs_disk_are_refused_with_the_sizes(s3: Any, team: Workspace, owner: Person) -> None:
    text = WORKFLOWS.replace("    artifacts: [./model]\n", "    artifacts: [./model]\n    resources: {disk: 1KB}\n")

    with pytest.raises(ApplicationError) as raised:
        _submit(team, owner, text)

    total = sum(len(f"sample {i}") for i in range(200)) + 8
    assert raised.value.message.startswith(".trainyard/workflows.yaml:8: workflows[0] (train).inputs[0]: ")
    assert f"the inputs of job train hold 1.9 KiB ({total:,} bytes: {URI} 1.8 KiB, s3://{DATA}/labels.txt 8 bytes)" in (
        raised.value.message
    )
    assert "more than its resources.disk of 1.0 KiB (1,024 bytes)" in raised.value.message
    assert not Run.objects.filter(workspace=team).exists()


def test_an_unchanged_dataset_is_a_cache_hit_and_a_changed_one_names_what_changed(
    s3: Any, team: Workspace, owner: Person
) -> None:
    instance = _runner(team)
    first = _submit(team, owner)
    jobs_schedule()
    _run_job(first.jobs.get(), instance)

    same = _submit(team, owner)
    jobs_schedule()
    s3.put_object(Bucket=DATA, Key="imagenet/train/0002.bin", Body=b"relabelled")
    s3.put_object(Bucket=DATA, Key="imagenet/train/new.bin", Body=b"new")
    changed = _submit(team, owner)
    jobs_schedule()

    hit, miss = same.jobs.get(), changed.jobs.get()
    assert hit.status == JobStatus.SUCCEEDED and hit.cached_from_id == first.jobs.get().pk
    assert miss.cached_from_id is None
    assert miss.cache_decision["text"] == (
        f"runs: input {URI} changed: 1 object added, 1 changed (train/new.bin, train/0002.bin)"
    )


def test_a_rerun_reads_the_recorded_versions_where_the_bucket_keeps_them_and_says_so_where_not(
    s3: Any, team: Workspace, owner: Person
) -> None:
    first = _submit(team, owner)
    s3.put_object(Bucket=DATA, Key="imagenet/train/0002.bin", Body=b"changed")

    again = run_rerun(run=first, user=owner.user)
    answer = owner.client().post(f"/api/v1/workspaces/{team.slug}/runs/{first.name}/rerun/")

    digests = [d["snapshot"] for d in again.jobs.get().spec["data"]]
    assert digests[0] != first.jobs.get().spec["data"][0]["snapshot"]  # listed afresh
    assert answer.status_code == 201, answer.content
    assert (
        f"input {URI}: the bucket keeps no versions: this re-run reads the objects as they are now"
        in answer.json()["notices"]
    )


def test_a_rerun_of_a_versioned_bucket_reads_what_the_first_run_read(s3: Any, team: Workspace, owner: Person) -> None:
    s3.put_bucket_versioning(Bucket=DATA, VersioningConfiguration={"Status": "Enabled"})
    for i in range(3):
        s3.put_object(Bucket=DATA, Key=f"imagenet/train/{i:04d}.bin", Body=f"sample {i}".encode())
    first = _submit(team, owner)
    s3.put_object(Bucket=DATA, Key="imagenet/train/0002.bin", Body=b"changed")

    answer = owner.client().post(f"/api/v1/workspaces/{team.slug}/runs/{first.name}/rerun/")
    again = Run.objects.get(name=answer.json()["name"], workspace=team)

    assert again.jobs.get().spec["data"][0]["snapshot"] == first.jobs.get().spec["data"][0]["snapshot"]
    assert answer.json()["notices"] == []


def test_the_dry_run_lists_each_input_its_size_and_which_idle_machine_holds_it(
    s3: Any, team: Workspace, owner: Person
) -> None:
    instance = _runner(team)
    first = _submit(team, owner)
    digest = first.jobs.get().spec["data"][0]["snapshot"]
    Instance.objects.filter(pk=instance.pk).update(status=InstanceStatus.IDLE)  # its job went elsewhere
    instance_heartbeat(instance_id=str(instance.pk), data_cached=[digest])
    body = {
        "workflow": "train",
        "workflows_file": {"path": ".trainyard/workflows.yaml", "text": WORKFLOWS},
        "code": {"kind": "git", "repo_url": "https://example.com/r.git", "commit": "b" * 40},
    }

    answer = owner.client().post(f"/api/v1/workspaces/{team.slug}/runs/plan/", body, format="json")

    assert answer.status_code == 200, answer.content
    [job] = answer.json()["jobs"]
    assert [(d["uri"], d["file_count"], d["cached_on"]) for d in job["data_inputs"]] == [
        (URI, 200, ["local-t"]),
        (f"s3://{DATA}/labels.txt", 1, []),
    ]
    assert job["data_inputs"][0]["size"] == "1.8 KiB"
    assert Run.objects.filter(workspace=team).count() == 1

"""What a run's page and ``trainyard show`` say each job reads and mounts
(moto's S3 over HTTP, real Postgres, the CLI through the real API): every
data input with the size of the listing it reads and every volume, from one
read of the run's snapshots; the runs list does not read them; and nothing
of another workspace shows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from backend.accounts.models import Workspace
from backend.clouds.models import BackendKind, Volume, VolumeStatus
from backend.data.models import DataSnapshot
from backend.data.services import data_endpoint_set
from backend.runs.models import Run
from tests.support.aws_account import admin
from tests.support.cli_wsgi import cli_as, cli_invoke, in_the_tests_transaction
from tests.support.fixtures import Person, submit
from tests.support.moto import MotoServer

BASE = "/api/v1/workspaces/acme"
DATA = "acme-data"
FILES = 20
WORKFLOWS = f"""\
workflows:
  - name: prepare
    provider: bash
    commands: [python prepare.py]
    artifacts: [./prepared]
    inputs:
      - s3://{DATA}/imagenet/
  - name: train
    provider: bash
    deps:
      - workflow: prepare
    commands: [python train.py]
    artifacts: [./model]
    inputs:
      - s3://{DATA}/imagenet/
      - uri: s3://{DATA}/labels.txt
        path: ./meta/labels.txt
    volumes: [ckpt:/data]
"""


@pytest.fixture
def s3(aws: MotoServer, team: Workspace) -> Any:
    """The workspace reads acme-data (versioned) through its S3-compatible endpoint (moto): FILES objects under imagenet/."""
    data_endpoint_set(
        workspace=team, endpoint_url=aws.url, region="us-east-1", access_key_id="testing", secret_access_key="testing"
    )
    client = admin(aws, "s3")
    client.create_bucket(Bucket=DATA)
    client.put_bucket_versioning(Bucket=DATA, VersioningConfiguration={"Status": "Enabled"})
    for i in range(FILES):
        client.put_object(Bucket=DATA, Key=f"imagenet/{i:04d}.bin", Body=b"x" * 1000)
    client.put_object(Bucket=DATA, Key="labels.txt", Body=b"cat\ndog\n")
    return client


@pytest.fixture
def ckpt(team: Workspace) -> Volume:
    return Volume.objects.create(
        workspace=team, name="ckpt", backend=BackendKind.AWS, region="us-east-1", zone="us-east-1b",
        size_bytes=2**30, backend_id="vol-0123456789abcdef0", status=VolumeStatus.AVAILABLE,
    )  # fmt: skip


def test_each_job_shows_the_data_it_reads_and_the_volumes_it_mounts(
    s3: Any, ckpt: Volume, team: Workspace, owner: Person
) -> None:
    run = submit(team, owner.user, "train", WORKFLOWS)

    with CaptureQueriesContext(connection) as queries:
        body = owner.client().get(f"{BASE}/runs/{run.name}/").json()

    jobs = {j["name"]: j for j in body["jobs"]}
    imagenet = {
        "uri": f"s3://{DATA}/imagenet/", "path": "imagenet", "read_only": True,
        "file_count": FILES, "total_size": FILES * 1000, "versioned": True,
    }  # fmt: skip
    labels = {
        "uri": f"s3://{DATA}/labels.txt", "path": "meta/labels.txt", "read_only": True,
        "file_count": 1, "total_size": 8, "versioned": True,
    }  # fmt: skip
    assert jobs["prepare"]["data_inputs"] == [imagenet]
    assert jobs["prepare"]["volumes"] == []
    assert jobs["train"]["data_inputs"] == [imagenet, labels]
    assert jobs["train"]["volumes"] == [{"name": "ckpt", "path": "/data", "read_only": False}]
    # Both jobs' snapshots in one read.
    assert sum("data_datasnapshot" in q["sql"] for q in queries.captured_queries) == 1


def test_the_runs_list_reads_no_snapshot_and_shows_no_data(
    s3: Any, ckpt: Volume, team: Workspace, owner: Person
) -> None:
    submit(team, owner.user, "train", WORKFLOWS)

    with CaptureQueriesContext(connection) as queries:
        listed = owner.client().get(f"{BASE}/runs/").json()["results"]

    assert "data_inputs" not in listed[0]["jobs"][0]
    assert not any("data_datasnapshot" in q["sql"] for q in queries.captured_queries)


def test_a_run_without_data_reads_no_snapshot(team: Workspace, owner: Person) -> None:
    run = submit(team, owner.user)

    with CaptureQueriesContext(connection) as queries:
        body = owner.client().get(f"{BASE}/runs/{run.name}/").json()

    assert [(j["data_inputs"], j["volumes"]) for j in body["jobs"]] == [([], [])]
    assert not any("data_datasnapshot" in q["sql"] for q in queries.captured_queries)


def test_nothing_of_another_workspace_shows(
    s3: Any, ckpt: Volume, team: Workspace, owner: Person, outsider: Person
) -> None:
    run = submit(team, owner.user, "train", WORKFLOWS)
    theirs = outsider.user.personal_workspace
    # A snapshot of the other workspace under the very digest the job names is not read.
    for mine in DataSnapshot.objects.filter(workspace=team):
        DataSnapshot.objects.create(
            workspace=theirs, digest=mine.digest, uri=mine.uri, root=mine.root, source="anonymous",
            file_count=7, total_size=7, versioned=True, listed_at=mine.listed_at, entries_packed=mine.entries_packed,
        )  # fmt: skip
    DataSnapshot.objects.filter(workspace=team).delete()

    shown = owner.client().get(f"{BASE}/runs/{run.name}/").json()
    refused = outsider.client().get(f"{BASE}/runs/{run.name}/")
    of_theirs = outsider.client().get(f"/api/v1/workspaces/{theirs.slug}/runs/{run.name}/")

    inputs = [d for j in shown["jobs"] for d in j["data_inputs"]]
    assert inputs and all((d["file_count"], d["total_size"], d["versioned"]) == (None, None, False) for d in inputs)
    assert refused.status_code in (403, 404)
    assert of_theirs.status_code == 404
    assert Run.objects.filter(workspace=theirs).count() == 0


@pytest.fixture
def _cli_in_the_tests_transaction() -> Iterator[None]:
    with in_the_tests_transaction():
        yield


@pytest.mark.usefixtures("_cli_in_the_tests_transaction")
def test_show_prints_each_jobs_data_and_volumes(
    s3: Any, ckpt: Volume, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.ALLOWED_HOSTS = ["*"]
    run = submit(team, owner.user, "train", WORKFLOWS)
    cli_as(monkeypatch, team, owner)

    code, out, err = cli_invoke("show", run.name)

    assert code == 0, err
    lines = out.splitlines()
    section = lines[lines.index("Data and volumes:") + 1 :][:4]
    assert section == [
        f"  prepare: data s3://{DATA}/imagenet/ → imagenet: {FILES} files, 19.5 KiB (versioned)",
        f"  train: data s3://{DATA}/imagenet/ → imagenet: {FILES} files, 19.5 KiB (versioned)",
        f"  train: data s3://{DATA}/labels.txt → meta/labels.txt: 1 file, 8 B (versioned)",
        "  train: volume ckpt at /data",
    ]

"""Snapshots no job names are deleted once a day unused (Celery beat's
``data-snapshots-prune``), bounded per call; a snapshot a job of its
workspace names is kept however old (real Postgres, moto's S3 over HTTP)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.data.models import DataSnapshot
from backend.data.services import data_endpoint_set, snapshots_prune
from backend.runs.models import Run
from tests.support.aws_account import admin
from tests.support.fixtures import Person, submit
from tests.support.moto import MotoServer

DATA = "acme-data"
WORKFLOWS = f"""\
workflows:
  - name: train
    provider: bash
    commands: [python train.py]
    inputs: [s3://{DATA}/imagenet/]
"""


@pytest.fixture
def s3(aws: MotoServer, team: Workspace) -> Any:
    data_endpoint_set(
        workspace=team, endpoint_url=aws.url, region="us-east-1", access_key_id="testing", secret_access_key="testing"
    )
    client = admin(aws, "s3")
    client.create_bucket(Bucket=DATA)
    client.put_object(Bucket=DATA, Key="imagenet/0.bin", Body=b"zero")
    return client


def _age(snapshot: DataSnapshot, days: float) -> None:
    DataSnapshot.objects.filter(pk=snapshot.pk).update(updated_at=timezone.now() - timedelta(days=days))


def _copy(snapshot: DataSnapshot, workspace: Workspace, digest: str) -> DataSnapshot:
    fields = {f: getattr(snapshot, f) for f in ("uri", "root", "source", "file_count", "total_size", "listed_at")}
    return DataSnapshot.objects.create(
        workspace=workspace, digest=digest, entries_packed=snapshot.entries_packed, **fields
    )


def test_a_snapshot_no_job_names_goes_after_a_day_and_a_named_one_stays(
    s3: Any, team: Workspace, owner: Person
) -> None:
    run = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    named = DataSnapshot.objects.get(workspace=team)
    assert run.jobs.get().spec["data"][0]["snapshot"] == named.digest
    orphan, fresh = _copy(named, team, "a" * 64), _copy(named, team, "b" * 64)
    other = Workspace.objects.create(slug="other", name="Other")
    elsewhere = _copy(named, other, named.digest)  # another workspace's job names none of its snapshots
    for snapshot in (named, orphan, elsewhere):
        _age(snapshot, 2)

    deleted = snapshots_prune()

    assert deleted == 2
    assert set(DataSnapshot.objects.values_list("pk", flat=True)) == {named.pk, fresh.pk}


def test_a_snapshot_whose_runs_are_gone_goes_and_a_reused_one_is_kept_a_day_more(
    s3: Any, team: Workspace, owner: Person
) -> None:
    submit(team, owner.user, workflow="train", text=WORKFLOWS)
    snapshot = DataSnapshot.objects.get(workspace=team)
    Run.objects.filter(workspace=team).delete()
    _age(snapshot, 2)
    submit(team, owner.user, workflow="train", text=WORKFLOWS)  # the same listing, used again
    Run.objects.filter(workspace=team).delete()

    assert snapshots_prune() == 0
    _age(snapshot, 2)
    assert snapshots_prune() == 1
    assert not DataSnapshot.objects.exists()


def test_each_call_is_bounded_and_the_next_goes_on(team: Workspace, s3: Any, owner: Person) -> None:
    submit(team, owner.user, workflow="train", text=WORKFLOWS)
    template = DataSnapshot.objects.get(workspace=team)
    for i in range(5):
        _age(_copy(template, team, f"{i:064x}"), 2)

    first = snapshots_prune(budget_seconds=0.0, per_pass=2)
    rest = snapshots_prune()

    assert (first, rest) == (2, 3)

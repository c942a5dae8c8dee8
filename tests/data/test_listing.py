"""Listing a workspace's data inputs at submission (moto's S3 over HTTP):
what is read, through which account, and the refusals a user reads."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.clouds.models import BackendKind, CloudAccount
from backend.core.errors import ApplicationError
from backend.data.models import DataSnapshot
from backend.data.services import (
    input_list,
    snapshot_change,
    snapshot_page,
    snapshot_store,
    snapshot_url,
)
from backend.data.sources import s3_access
from backend.vault.crypto import encrypt
from tests.support.aws_account import admin, iam_user
from tests.support.moto import MotoServer, s3_account

DATA = "acme-data"


def _later() -> float:
    return time.monotonic() + 60


def _fill(server: MotoServer, count: int = 200, *, prefix: str = "imagenet/", versioned: bool = False) -> Any:
    s3 = admin(server, "s3")
    s3.create_bucket(Bucket=DATA)
    if versioned:
        s3.put_bucket_versioning(Bucket=DATA, VersioningConfiguration={"Status": "Enabled"})
    for i in range(count):
        s3.put_object(Bucket=DATA, Key=f"{prefix}train/{i:04d}.bin", Body=f"sample {i}".encode())
    return s3


@pytest.fixture
def account(aws: MotoServer, team: Workspace) -> CloudAccount:
    return s3_account(team)


def test_a_prefix_of_200_objects_lists_every_one_through_the_account(
    aws: MotoServer, team: Workspace, account: CloudAccount
) -> None:
    _fill(aws)

    listing = input_list(workspace_id=team.pk, uri=f"s3://{DATA}/imagenet/", deadline=_later())

    assert listing.file_count == 200
    assert listing.total_size == sum(len(f"sample {i}") for i in range(200))
    assert listing.entries[0].path == "train/0000.bin"
    assert listing.root == f"s3://{DATA}/imagenet/"
    assert listing.source == f"aws:{account.pk}"
    assert not listing.versioned
    assert all(e.etag and not e.version_id for e in listing.entries)


def test_a_prefix_without_its_slash_and_one_object_both_list(aws: MotoServer, team: Workspace, account: Any) -> None:
    _fill(aws, 3)

    prefix = input_list(workspace_id=team.pk, uri=f"s3://{DATA}/imagenet", deadline=_later())
    one = input_list(workspace_id=team.pk, uri=f"s3://{DATA}/imagenet/train/0001.bin", deadline=_later())

    assert [e.path for e in prefix.entries] == ["train/0000.bin", "train/0001.bin", "train/0002.bin"]
    assert [(e.path, e.size) for e in one.entries] == [("", len("sample 1"))]


def test_a_versioned_bucket_records_each_objects_latest_version(aws: MotoServer, team: Workspace, account: Any) -> None:
    s3 = _fill(aws, 3, versioned=True)
    s3.put_object(Bucket=DATA, Key="imagenet/train/0001.bin", Body=b"newer")

    listing = input_list(workspace_id=team.pk, uri=f"s3://{DATA}/imagenet/", deadline=_later())

    assert listing.versioned
    assert listing.file_count == 3
    latest = s3.head_object(Bucket=DATA, Key="imagenet/train/0001.bin")["VersionId"]
    assert dict((e.path, e.version_id) for e in listing.entries)["train/0001.bin"] == latest


def test_the_digest_is_stable_and_names_what_changed(aws: MotoServer, team: Workspace, account: Any) -> None:
    s3 = _fill(aws, 5)
    uri = f"s3://{DATA}/imagenet/"
    first = input_list(workspace_id=team.pk, uri=uri, deadline=_later())
    again = input_list(workspace_id=team.pk, uri=uri, deadline=_later())

    s3.put_object(Bucket=DATA, Key="imagenet/train/0002.bin", Body=b"changed")
    s3.put_object(Bucket=DATA, Key="imagenet/train/new-a.bin", Body=b"a")
    s3.put_object(Bucket=DATA, Key="imagenet/train/new-b.bin", Body=b"b")
    s3.put_object(Bucket=DATA, Key="imagenet/train/new-c.bin", Body=b"c")
    s3.delete_object(Bucket=DATA, Key="imagenet/train/0004.bin")
    later = input_list(workspace_id=team.pk, uri=uri, deadline=_later())

    assert first.digest == again.digest
    assert later.digest != first.digest
    change = snapshot_change(first.entries, later.entries)
    assert change.text() == "3 objects added, 1 changed, 1 removed"
    assert change.changed == ("train/0002.bin",)


def test_snapshots_are_stored_once_per_digest_and_per_workspace(aws: MotoServer, team: Workspace, account: Any) -> None:
    _fill(aws, 4)
    listing = input_list(workspace_id=team.pk, uri=f"s3://{DATA}/imagenet/", deadline=_later())

    first = snapshot_store(workspace_id=team.pk, listing=listing)
    second = snapshot_store(workspace_id=team.pk, listing=listing)

    assert first.pk == second.pk
    assert DataSnapshot.objects.filter(workspace=team).count() == 1
    assert [e.path for e in first.entries] == [e.path for e in listing.entries]


def test_pages_hand_out_urls_that_download_the_listed_bytes(aws: MotoServer, team: Workspace, account: Any) -> None:
    import urllib.request

    s3 = _fill(aws, 5, versioned=True)
    listing = input_list(workspace_id=team.pk, uri=f"s3://{DATA}/imagenet/", deadline=_later())
    snapshot = snapshot_store(workspace_id=team.pk, listing=listing)
    s3.put_object(Bucket=DATA, Key="imagenet/train/0000.bin", Body=b"overwritten after the listing")

    files, after = snapshot_page(snapshot=snapshot, after="", limit=2)
    rest, end = snapshot_page(snapshot=snapshot, after=after, limit=10)

    assert [f.path for f in files] == ["train/0000.bin", "train/0001.bin"]
    assert after == "train/0001.bin"
    assert [f.path for f in rest] == ["train/0002.bin", "train/0003.bin", "train/0004.bin"]
    assert end == ""
    with urllib.request.urlopen(files[0].url, timeout=10) as answer:
        assert answer.read() == b"sample 0"  # the listed version, not the newer one
    assert "versionId=" in snapshot_url(snapshot=snapshot, path="train/0000.bin")
    assert len({f.identity for f in [*files, *rest]}) == 5


def test_an_empty_prefix_and_a_missing_bucket_are_named(aws: MotoServer, team: Workspace, account: Any) -> None:
    _fill(aws, 1)

    with pytest.raises(ApplicationError) as empty:
        input_list(workspace_id=team.pk, uri=f"s3://{DATA}/nothing-here/", deadline=_later())
    with pytest.raises(ApplicationError) as missing:
        input_list(workspace_id=team.pk, uri="s3://no-such-bucket-here/x/", deadline=_later())

    assert empty.value.message.startswith(f"input s3://{DATA}/nothing-here/: no object is stored under this prefix")
    assert "no bucket no-such-bucket-here" in missing.value.message


def test_a_bucket_the_account_may_not_list_names_the_account_and_the_permissions(
    aws: MotoServer, team: Workspace
) -> None:
    _fill(aws, 1)
    key, secret = iam_user(aws, "no-s3", actions=["sts:GetCallerIdentity", "ec2:Describe*"])
    CloudAccount.objects.create(
        workspace=team,
        kind=BackendKind.AWS,
        name="aws",
        config={"bucket": "ty-artifacts", "regions": ["us-east-1"], "aws_account_id": "123456789012"},
        credentials_ciphertext=encrypt(json.dumps({"access_key_id": key, "secret_access_key": secret})),
    )

    with aws.iam_auth(), pytest.raises(ApplicationError) as raised:
        input_list(workspace_id=team.pk, uri=f"s3://{DATA}/imagenet/", deadline=_later())

    assert raised.value.message.startswith(
        f"input s3://{DATA}/imagenet/: the AWS account 123456789012 (its access keys) may not read bucket {DATA}"
    )
    assert f"s3:ListBucket on arn:aws:s3:::{DATA}" in raised.value.message
    assert "s3:GetObject" in raised.value.message


def test_more_objects_than_the_bound_is_refused(
    aws: MotoServer, team: Workspace, account: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backend.data import services

    _fill(aws, 5)
    monkeypatch.setattr(services, "MAX_OBJECTS", 3)

    with pytest.raises(ApplicationError) as raised:
        input_list(workspace_id=team.pk, uri=f"s3://{DATA}/imagenet/", deadline=_later())

    assert "more than 3 objects under this prefix" in raised.value.message


def test_a_workspace_without_account_reads_through_its_endpoint_else_anonymously(
    aws: MotoServer, team: Workspace
) -> None:
    from backend.data.services import data_endpoint_set

    assert s3_access(workspace_id=team.pk, bucket=DATA).source == "anonymous"
    data_endpoint_set(
        workspace=team, endpoint_url=aws.url, region="", access_key_id="testing", secret_access_key="testing"
    )
    _fill(aws, 2)

    listing = input_list(workspace_id=team.pk, uri=f"s3://{DATA}/imagenet/", deadline=_later())

    assert listing.source == f"endpoint:{aws.url}"
    assert listing.file_count == 2

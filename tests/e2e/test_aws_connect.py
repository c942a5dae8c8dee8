"""Connecting AWS through the CLI against the real stack, whose web process
calls moto's server over HTTP: keys, listing, offers, instances, removal
refused while a machine is live, and another user who sees none of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import User, as_json
from tests.support.aws_account import BUCKET, prepare
from tests.support.moto import MotoServer
from tests.support.stack import Stack

SECRET = "e2e-secret-access-key-value"


@pytest.fixture
def ada(stack: Stack) -> User:
    """A workspace of its own: its AWS account and bucket (gone with this
    file's moto server) are no other file's storage."""
    return User("ada", stack.issue_token("ada"), stack)


@pytest.fixture
def ben(stack: Stack) -> User:
    return User("ben", stack.issue_token("ben"), stack)


def _add_keys(user: User, cwd: Path, *extra: str, env: dict[str, str] | None = None) -> object:
    return user.cli(
        cwd,
        "backend",
        "add",
        "aws",
        "--access-key-id",
        "AKIAE2ETESTKEY",
        "--regions",
        "us-east-1",
        "--bucket",
        BUCKET,
        *extra,
        env=env,
    )


def test_connect_list_and_remove_an_aws_account_with_the_cli(
    aws: MotoServer, ada: User, ben: User, tmp_path: Path
) -> None:
    prepare(aws, regions=["us-east-1"])
    cwd = tmp_path / "here"
    cwd.mkdir()

    added = _add_keys(ada, cwd, env={"AWS_SECRET_ACCESS_KEY": SECRET})
    assert added.returncode == 0, added.stderr
    assert "Connected backend aws (AWS account 123456789012): active" in added.stderr

    listed = ada.cli(cwd, "backend", "ls")
    assert listed.returncode == 0, listed.stderr
    assert "aws" in listed.stdout and "active" in listed.stdout and BUCKET in listed.stdout
    raw = as_json(ada.cli(cwd, "backend", "ls", "--json"))
    assert [b["name"] for b in raw if b["kind"] == "aws"] == ["aws"]
    assert SECRET not in listed.stdout + ada.cli(cwd, "backend", "ls", "--json").stdout

    again = _add_keys(ada, cwd, "--secret-access-key", SECRET)
    assert again.returncode == 1
    assert again.stderr.strip().endswith("or pick another --name.")
    assert "Traceback" not in again.stderr

    # Ben's workspace: none of it.
    assert [b["name"] for b in as_json(ben.cli(cwd, "backend", "ls", "--json")) if b["kind"] == "aws"] == []
    refused = ben.cli(cwd, "backend", "rm", "aws")
    assert (refused.returncode, refused.stderr.strip()) == (1, "error: Backend 'aws' not found.")

    # A live machine of the account blocks its removal, with the server's words.
    ada.stack.manage(
        "shell",
        "-c",
        "from backend.clouds.models import CloudAccount, Instance; "
        f"a = CloudAccount.objects.get(name='aws', kind='aws', workspace__slug='{ada.workspace}'); "
        "Instance.objects.create(workspace=a.workspace, account=a, backend='aws', name='aws-e2e1', token_hash='e2e1', "
        "instance_type='g5.xlarge', region='us-east-1', zone='us-east-1a', spot=True, price_per_hour='0.4123', "
        "backend_id='i-0e2e')",
    )
    shown = ada.cli(cwd, "instances")
    assert shown.returncode == 0, shown.stderr
    [row] = [line for line in shown.stdout.splitlines() if "aws-e2e1" in line]
    assert row.split() == [
        "aws-e2e1",
        "aws",
        "g5.xlarge",
        "us-east-1",
        "spot",
        "$0.4123",
        "provisioning",
        *row.split()[7:],
    ]
    blocked = ada.cli(cwd, "backend", "rm", "aws")
    assert blocked.returncode == 1
    assert blocked.stderr.startswith("error: Backend 'aws' still has 1 live instance(s): aws-e2e1 (provisioning).")

    ada.stack.manage(
        "shell",
        "-c",
        "from backend.clouds.models import Instance; Instance.objects.filter(name='aws-e2e1').update(status='terminated')",
    )
    removed = ada.cli(cwd, "backend", "rm", "aws")
    assert removed.returncode == 0, removed.stderr
    assert [b["name"] for b in as_json(ada.cli(cwd, "backend", "ls", "--json")) if b["kind"] == "aws"] == []


def test_a_missing_bucket_is_the_servers_message_and_nothing_is_saved(
    aws: MotoServer, ada: User, tmp_path: Path
) -> None:
    prepare(aws, regions=["us-east-1"], bucket=None)

    result = _add_keys(ada, tmp_path, "--name", "aws-nobucket", "--secret-access-key", SECRET)

    assert result.returncode == 1
    assert "error: bucket my-artifacts does not exist (NoSuchBucket)" in result.stderr
    assert "Traceback" not in result.stderr
    assert [b for b in as_json(ada.cli(tmp_path, "backend", "ls", "--json")) if b["name"] == "aws-nobucket"] == []


def test_a_role_prints_the_external_id_and_the_policies_first(aws: MotoServer, ada: User, tmp_path: Path) -> None:
    prepare(aws, regions=["us-east-1"])
    setup = as_json(ada.cli(tmp_path, "backend", "setup", "aws", "--json"))

    result = ada.cli(
        tmp_path,
        "backend",
        "add",
        "aws",
        "--name",
        "aws-role",
        "--role-arn",
        "arn:aws:iam::123456789012:role/trainyard",
        "--regions",
        "us-east-1",
        "--bucket",
        BUCKET,
    )

    assert result.returncode == 0, result.stderr
    assert f"External id of this workspace: {setup['external_id']}" in result.stderr
    assert '"sts:ExternalId": "' + setup["external_id"] + '"' in result.stderr
    assert "arn:aws:s3:::my-artifacts/trainyard/*" in result.stderr
    assert "Connected backend aws-role" in result.stderr
    assert ada.cli(tmp_path, "backend", "rm", "aws-role").returncode == 0


def test_offers_print_a_table_cheapest_first(ada: User, tmp_path: Path) -> None:
    result = ada.cli(tmp_path, "offers", "--memory", "1GB", "--on-demand")

    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["REGION", "ZONE", "TYPE", "MARKET", "PRICE/H", "CPUS", "MEMORY", "GPUS"]
    assert rows and all("on-demand" in row for row in rows)
    bad = ada.cli(tmp_path, "offers", "--memory", "lots")
    assert (bad.returncode, bad.stderr.startswith("error: memory 'lots': expected a size")) == (1, True)

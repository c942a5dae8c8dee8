"""Connecting AWS accounts against moto's server over HTTP (never a patched boto3)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.clouds.backends.aws.session import base_session
from backend.clouds.models import AccountStatus, AwsExternalId, CloudAccount, Instance, InstanceStatus
from backend.clouds.services.accounts import account_config, account_mark_broken
from backend.clouds.services.connections import (
    aws_connect,
    aws_external_id,
    aws_setup,
    aws_validate,
    backend_remove,
)
from backend.core.errors import ApplicationError
from backend.vault.crypto import decrypt
from tests.support.aws_account import BUCKET, REGIONS, admin, bucket_keys, iam_user, main_route_table, prepare
from tests.support.fixtures import Person
from tests.support.moto import MotoServer

ROLE = "arn:aws:iam::123456789012:role/trainyard"


def connect_keys(team: Workspace, owner: Person, **kwargs: Any) -> CloudAccount:
    args: dict[str, Any] = {
        "access_key_id": "AKIATESTING",
        "secret_access_key": "s3cret-value",
        "regions": list(REGIONS),
        "bucket": BUCKET,
    }
    return aws_connect(workspace=team, user=owner.user, **{**args, **kwargs})


def test_connect_with_keys_checks_every_region_and_encrypts_the_keys(
    aws: MotoServer, team: Workspace, owner: Person
) -> None:
    prepare(aws)

    account = connect_keys(team, owner)

    assert (account.kind, account.name, account.status) == ("aws", "aws", AccountStatus.ACTIVE)
    assert account.validated_at is not None
    assert account.config == {
        "regions": ["us-east-1", "eu-west-1"],
        "bucket": BUCKET,
        "prefix": "trainyard/",
        "aws_account_id": "123456789012",
    }
    stored = bytes(account.credentials_ciphertext)
    assert b"s3cret-value" not in stored
    assert json.loads(decrypt(stored)) == {"access_key_id": "AKIATESTING", "secret_access_key": "s3cret-value"}
    assert bucket_keys(aws) == []  # the check object was deleted again
    assert aws.our_instances() == []  # the launch was a dry run


def test_connect_with_a_role_sends_the_workspaces_external_id(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws)
    sent: list[dict[str, Any]] = []
    base_session().events.register("before-call.sts.AssumeRole", lambda params, **_: sent.append(params["body"]))

    account = aws_connect(workspace=team, user=owner.user, role_arn=ROLE, regions=["us-east-1"], bucket=BUCKET)

    external_id = AwsExternalId.objects.get(workspace=team).value
    assert external_id.startswith("trainyard-") and len(external_id) == 42
    assert account.config["external_id"] == external_id
    assert account.config["role_arn"] == ROLE
    assert bytes(account.credentials_ciphertext) == b""
    assert [(b["RoleArn"], b["ExternalId"]) for b in sent] == [(ROLE, external_id)]


def test_the_external_id_is_made_once_per_workspace(team: Workspace, outsider: Person) -> None:
    first = aws_external_id(workspace=team)
    other = aws_external_id(workspace=outsider.user.personal_workspace)

    assert aws_external_id(workspace=team) == first
    assert other != first
    assert aws_setup(workspace=team).external_id == first


def test_setup_shows_the_trust_policy_with_the_principal_and_the_policy_for_the_bucket(
    team: Workspace, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "AWS_PRINCIPAL_ARN": "arn:aws:iam::999999999999:role/trainyard-server"}

    setup = aws_setup(workspace=team, bucket="my-artifacts")

    statement = setup.trust_policy["Statement"][0]
    assert statement["Principal"] == {"AWS": "arn:aws:iam::999999999999:role/trainyard-server"}
    assert statement["Condition"] == {"StringEquals": {"sts:ExternalId": setup.external_id}}
    text = json.dumps(setup.permission_policy)
    assert "${" not in text
    assert "arn:aws:s3:::my-artifacts/trainyard/*" in text
    assert f'"aws:ResourceTag/trainyard:installation": "{setup.installation}"' in text


def test_wrong_keys_are_named_and_nothing_is_saved(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws)

    with aws.iam_auth(), pytest.raises(ApplicationError) as raised:
        connect_keys(team, owner, access_key_id="AKIAWRONGWRONG")

    assert raised.value.message.startswith("AWS rejected the access key AKIA…: InvalidClientTokenId")
    assert raised.value.extra == {"code": "InvalidClientTokenId"}
    assert not CloudAccount.objects.filter(workspace=team).exists()


def test_real_iam_keys_pass_with_moto_checking_every_call(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws)
    key, secret = iam_user(aws, "trainyard")

    with aws.iam_auth():
        account = connect_keys(team, owner, access_key_id=key, secret_access_key=secret)

    assert account.status == AccountStatus.ACTIVE


def test_a_missing_launch_permission_names_the_action_and_the_region(
    aws: MotoServer, team: Workspace, owner: Person
) -> None:
    prepare(aws)
    key, secret = iam_user(aws, "no-launch", actions=["sts:GetCallerIdentity", "ec2:Describe*", "s3:*"])

    with aws.iam_auth(), pytest.raises(ApplicationError) as raised:
        connect_keys(team, owner, access_key_id=key, secret_access_key=secret)

    assert raised.value.message.startswith(
        "the AWS credentials may not launch machines in us-east-1: ec2:RunInstances was refused"
    )
    assert not CloudAccount.objects.filter(workspace=team).exists()


def test_a_missing_bucket_is_named_and_nothing_is_saved(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws, bucket=None)

    with pytest.raises(ApplicationError) as raised:
        connect_keys(team, owner)

    assert raised.value.message.startswith("bucket my-artifacts does not exist (NoSuchBucket)")
    assert not CloudAccount.objects.filter(workspace=team).exists()


def test_a_subnet_without_a_route_out_is_named(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws, regions=["us-east-1"])  # eu-west-1's default VPC has no internet gateway

    with pytest.raises(ApplicationError) as raised:
        connect_keys(team, owner)

    assert "in eu-west-1 has no route to the internet" in raised.value.message
    assert raised.value.message.startswith("subnet subnet-")
    assert not CloudAccount.objects.filter(workspace=team).exists()


def test_configured_subnets_must_exist(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws)

    with pytest.raises(ApplicationError) as raised:
        connect_keys(team, owner, regions=["us-east-1"], subnets={"us-east-1": ["subnet-0123456789abcdef0"]})

    assert raised.value.message.startswith("subnets subnet-0123456789abcdef0 in us-east-1:")
    assert raised.value.extra == {"code": "InvalidSubnetID.NotFound"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"role_arn": ROLE}, "give either a role ARN or access keys, not both"),
        ({"regions": []}, "name at least one region (e.g. us-east-1)"),
        ({"regions": ["mars-1"]}, "not an AWS region: mars-1 (e.g. us-east-1)"),
        ({"bucket": "My_Bucket"}, "bucket 'My_Bucket' is not an S3 bucket name"),
        ({"secret_access_key": ""}, "access keys need both access_key_id and secret_access_key"),
        ({"name": "local"}, "backend name 'local' is the server's own local backend"),
        ({"amis": {"ap-south-1": "ami-12345678"}}, "amis names region ap-south-1, which is not in regions"),
    ],
)
def test_bad_input_is_refused_before_calling_aws(
    kwargs: dict[str, Any], message: str, team: Workspace, owner: Person
) -> None:
    # No moto here: a call to AWS would fail differently.
    with pytest.raises(ApplicationError) as raised:
        connect_keys(team, owner, **kwargs)

    assert raised.value.message.startswith(message)
    assert not CloudAccount.objects.filter(workspace=team).exists()


def test_a_second_account_of_the_same_name_is_refused(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws)
    connect_keys(team, owner)

    with pytest.raises(ApplicationError) as raised:
        connect_keys(team, owner)

    assert raised.value.status_code == 409
    assert CloudAccount.objects.filter(workspace=team).count() == 1


def test_a_broken_account_is_active_again_after_validation(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws)
    account = connect_keys(team, owner)
    account_mark_broken(account_id=str(account.pk), message="AuthFailure: the key was deactivated")
    account.refresh_from_db()
    assert (account.status, account.status_reason) == (AccountStatus.BROKEN, "AuthFailure: the key was deactivated")
    first_validated = account.validated_at

    validated = aws_validate(account=account)

    assert (validated.status, validated.status_reason) == (AccountStatus.ACTIVE, "")
    assert validated.validated_at is not None and first_validated is not None
    assert validated.validated_at > first_validated


def test_validation_that_fails_marks_the_account_broken_with_the_reason(
    aws: MotoServer, team: Workspace, owner: Person
) -> None:
    prepare(aws)
    account = connect_keys(team, owner)
    ec2 = admin(aws, "ec2", "eu-west-1")
    ec2.delete_route(RouteTableId=main_route_table(aws, "eu-west-1"), DestinationCidrBlock="0.0.0.0/0")

    with pytest.raises(ApplicationError) as raised:
        aws_validate(account=account)

    account.refresh_from_db()
    assert account.status == AccountStatus.BROKEN
    assert account.status_reason == raised.value.message
    assert "in eu-west-1 has no route to the internet" in account.status_reason


def test_validation_uses_the_stored_encrypted_keys(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws)
    key, secret = iam_user(aws, "trainyard")
    account = connect_keys(team, owner, access_key_id=key, secret_access_key=secret)
    assert account_config(account).credentials == {"access_key_id": key, "secret_access_key": secret}
    admin(aws, "iam").delete_access_key(UserName="trainyard", AccessKeyId=key)

    with aws.iam_auth(), pytest.raises(ApplicationError) as raised:
        aws_validate(account=account)

    assert raised.value.message.startswith(f"AWS rejected the access key {key[:4]}…: InvalidClientTokenId")


def _instance(account: CloudAccount, name: str, status: InstanceStatus) -> Instance:
    return Instance.objects.create(
        workspace=account.workspace,
        account=account,
        backend=account.kind,
        name=name,
        status=status,
        token_hash=name,
        terminated_at=timezone.now() if status == InstanceStatus.TERMINATED else None,
    )


def test_remove_is_refused_while_an_instance_is_live(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws)
    account = connect_keys(team, owner)
    _instance(account, "aws-1a2b", InstanceStatus.BUSY)
    _instance(account, "aws-3c4d", InstanceStatus.TERMINATING)
    _instance(account, "aws-old", InstanceStatus.TERMINATED)

    with pytest.raises(ApplicationError) as raised:
        backend_remove(account=account)

    assert raised.value.status_code == 409
    assert raised.value.message.startswith(
        "Backend 'aws' still has 2 live instance(s): aws-1a2b (busy), aws-3c4d (terminating)."
    )
    assert CloudAccount.objects.filter(pk=account.pk).exists()


def test_remove_keeps_ended_instances_without_the_account(aws: MotoServer, team: Workspace, owner: Person) -> None:
    prepare(aws)
    account = connect_keys(team, owner)
    old = _instance(account, "aws-old", InstanceStatus.TERMINATED)

    backend_remove(account=account)

    assert not CloudAccount.objects.filter(pk=account.pk).exists()
    old.refresh_from_db()
    assert old.account is None and old.name == "aws-old"

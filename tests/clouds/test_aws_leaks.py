"""The leak sweep on moto's server over HTTP, in process: an instance that
carries our installation's and the account's tags but has no Instance row
(a crash between RunInstances and the row's update, a row deleted by hand)
is terminated by ``clouds_reconcile``; an untagged instance and another
installation's instance are left alone (the test terminates them)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import boto3

from backend.accounts.models import Workspace
from backend.clouds.backends.aws.compute import AwsCompute
from backend.clouds.backends.base import LaunchSpec, Requirements
from backend.clouds.models import BackendKind, CloudAccount, Instance
from backend.clouds.services.accounts import account_config, compute_of, installation
from backend.clouds.services.reconcile import clouds_reconcile
from backend.vault.crypto import encrypt
from tests.clouds.subjects import MOTO_SDA1_AMI
from tests.support.accounttasks import run_account_tasks
from tests.support.moto import MotoServer

REGION = "us-east-1"


def _state(ec2: Any, instance_id: str) -> str:
    answer = ec2.describe_instances(InstanceIds=[instance_id])
    return str(answer["Reservations"][0]["Instances"][0]["State"]["Name"])


def _spec(key: str) -> LaunchSpec:
    return LaunchSpec(
        idempotency_key=key,
        instance_name=key,
        runner_token="token",
        server_url="http://127.0.0.1:9",
        tags={"Name": key},
        user_data="",
    )


def test_the_sweep_terminates_our_orphan_and_leaves_untagged_and_foreign_instances_alone(
    aws: MotoServer, team: Workspace, settings: Any
) -> None:
    settings.TRAINYARD = {
        **settings.TRAINYARD,
        "LOCAL_BACKEND_ENABLED": False,
        "LEAK_MIN_AGE_SECONDS": 0,
        "LEAK_SWEEP_SECONDS": 0,
    }
    credentials = {"access_key_id": "testing", "secret_access_key": "testing"}
    account = CloudAccount.objects.create(
        workspace=team,
        kind=BackendKind.AWS,
        name="aws",
        config={"regions": [REGION], "amis": {REGION: MOTO_SDA1_AMI}},
        credentials_ciphertext=encrypt(json.dumps(credentials)),
    )
    ours = compute_of(account)
    assert isinstance(ours, AwsCompute)
    offer = next(o for o in ours.offers(Requirements(spot_policy="on-demand")) if o.instance_type == "c6i.large")
    orphan = ours.launch(offer, _spec("ty-orphan"))  # tagged like any launch, and no row names it
    assert not Instance.objects.filter(idempotency_key="ty-orphan").exists()

    # Another installation (another Trainyard server) on the same cloud account and account id.
    foreign = AwsCompute(dataclasses.replace(account_config(account), installation="ty-someone-else"))
    theirs = foreign.launch(offer, _spec("ty-theirs"))
    ec2 = boto3.client("ec2", region_name=REGION)
    untagged = ec2.run_instances(ImageId=MOTO_SDA1_AMI, InstanceType="c6i.large", MinCount=1, MaxCount=1)
    untagged_id = str(untagged["Instances"][0]["InstanceId"])
    [described] = ec2.describe_instances(InstanceIds=[orphan.backend_id])["Reservations"][0]["Instances"]
    tags = {t["Key"]: t["Value"] for t in described["Tags"]}
    assert tags["trainyard:installation"] == installation() and tags["trainyard:account"] == str(account.pk)

    try:
        clouds_reconcile()
        run_account_tasks()

        assert _state(ec2, orphan.backend_id) in ("shutting-down", "terminated")
        assert _state(ec2, theirs.backend_id) == "running"
        assert _state(ec2, untagged_id) == "running"
        assert [h.backend_id for h in ours.list_managed()] == []
        assert [h.backend_id for h in foreign.list_managed()] == [theirs.backend_id]
    finally:
        ec2.terminate_instances(InstanceIds=[untagged_id, theirs.backend_id, orphan.backend_id])

"""A launch from a process that has not launched before (decision 0044;
bench/results/2026-12-01-whole-bench.md, "The AWS part: where the time goes"): botocore's data is read once per process into one loader
every session shares (and before the Celery worker forks, ``warm``), and the
ids RunInstances needs come from the account's facts. On moto's server over HTTP."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from backend.clouds.backends.aws.compute import AwsCompute
from backend.clouds.backends.aws.facts import AccountFacts
from backend.clouds.backends.aws.session import AwsAuth, client, session_for, warm
from backend.clouds.backends.fake.compute import FakeCompute
from backend.clouds.services.accounts import backends_warm
from tests.clouds.test_aws import INSTALLATION, MOTO_XVDA_AMI, REGION, Cloud, calls_of, offer
from tests.support.moto import MotoServer

ZONE = "use1-az1"
LOOKUPS = ["DescribeImages", "DescribeVpcs", "DescribeSubnets", "DescribeSecurityGroups", "CreateSecurityGroup"]


@pytest.fixture
def cloud(aws: MotoServer) -> Iterator[Cloud]:
    made = Cloud(aws)
    yield made
    made.clean_up()


# ------------------------------------------------------------------ botocore's data, once per process


def test_every_session_reads_botocore_data_through_one_loader_whose_paths_do_not_grow(aws: MotoServer) -> None:
    sessions = [session_for(AwsAuth(access_key_id=f"AKIA{n}", secret_access_key="secret")) for n in range(5)]

    loaders = {id(s._session.get_component("data_loader")) for s in sessions}
    assert len(loaders) == 1
    paths = sessions[0]._session.get_component("data_loader").search_paths
    assert len(paths) == len(set(paths)), "boto3 appends its data path per session: kept once"
    assert paths[-1].endswith("boto3/data")


def test_after_warm_a_new_sessions_first_clients_read_no_json(
    aws: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    warm()
    auth = AwsAuth(access_key_id="AKIANEW", secret_access_key="secret")

    with caplog.at_level(logging.DEBUG, logger="botocore.loaders"):
        ec2 = client(auth, "ec2", REGION)
        ec2.get_paginator("describe_instances")
        client(auth, "ec2", REGION, launch=True)
        client(auth, "s3", REGION)
        client(auth, "sts", REGION)

    assert [r.getMessage() for r in caplog.records if "Loading JSON file" in r.getMessage()] == []


def test_a_client_is_made_once_per_session_region_and_kind(aws: MotoServer) -> None:
    auth = AwsAuth(access_key_id="AKIAONE", secret_access_key="secret")

    assert client(auth, "ec2", REGION) is client(auth, "ec2", REGION)
    assert client(auth, "ec2", REGION, launch=True) is not client(auth, "ec2", REGION)
    assert client(auth, "ec2", "eu-west-1") is not client(auth, "ec2", REGION)


class _Warmed(FakeCompute):
    kind = "warmed"
    calls = 0

    @classmethod
    def warm(cls) -> None:
        cls.calls += 1


class _Broken(FakeCompute):
    kind = "broken"

    @classmethod
    def warm(cls) -> None:
        raise RuntimeError("no SDK here")


def test_the_worker_warms_every_backend_kind_unless_turned_off(settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    module = __name__
    kinds = {"warmed": f"{module}:_Warmed", "broken": f"{module}:_Broken"}
    settings.TRAINYARD = {**settings.TRAINYARD, "BACKEND_KINDS": kinds, "WARM_BACKENDS": False}
    _Warmed.calls = 0

    backends_warm()
    assert _Warmed.calls == 0

    settings.TRAINYARD = {**settings.TRAINYARD, "WARM_BACKENDS": True}
    backends_warm()
    assert _Warmed.calls == 1, "a kind that fails to warm does not stop the others"
    assert "warming the broken backend failed" in caplog.text


# ------------------------------------------------------------------ the launch's ids, in the facts


def test_facts_hold_the_ids_a_launch_needs_so_a_new_process_looks_none_up(cloud: Cloud) -> None:
    first = cloud.build()
    cloud.launch(first, offer(first))  # creates the installation's security group
    stored = json.loads(json.dumps(cloud.build().refresh_facts()))  # what the services persist
    launch = stored["regions"][REGION]["launch"]
    assert launch["images"]["cpu"]["image_id"] == "ami-03cf127a"
    assert set(launch["networks"]) == set(stored["regions"][REGION]["zones"])
    [group] = launch["security_groups"].values()

    fresh = cloud.build(facts=stored)  # another process: nothing cached
    seen = calls_of(fresh, [*LOOKUPS, "RunInstances"])
    cloud.launch(fresh, offer(fresh, zone=ZONE))

    assert {op: len(found) for op, found in seen.items()} == {**dict.fromkeys(LOOKUPS, 0), "RunInstances": 1}
    [zoned] = seen["RunInstances"]
    assert zoned["SecurityGroupIds"] == [group]
    assert zoned["SubnetId"] == launch["networks"][ZONE]["subnet_id"]
    assert zoned["ImageId"] == "ami-03cf127a"


def test_a_deleted_security_group_of_the_facts_is_made_again_and_the_launch_tried_again(cloud: Cloud) -> None:
    first = cloud.build()
    handle = cloud.launch(first, offer(first))
    facts = cloud.build().refresh_facts()
    cloud.ec2().terminate_instances(InstanceIds=[handle.backend_id])
    [old] = _groups(cloud)
    cloud.ec2().delete_security_group(GroupId=old)

    fresh = cloud.build(facts=facts)
    seen = calls_of(fresh, ["RunInstances", "CreateSecurityGroup"])
    again = cloud.launch(fresh, offer(fresh, zone=ZONE))

    [new] = _groups(cloud)
    assert new != old
    assert [call["SecurityGroupIds"] for call in seen["RunInstances"]] == [[old], [new]]
    assert len(seen["CreateSecurityGroup"]) == 1
    assert [g["GroupId"] for g in cloud.instance(again)["SecurityGroups"]] == [new]
    cloud.launch(fresh, offer(fresh, zone=ZONE))
    assert len(seen["RunInstances"]) == 3, "the stale id is not used again by this process"


def test_ids_found_for_another_config_are_not_used(cloud: Cloud) -> None:
    facts = cloud.build().refresh_facts()  # found for ami-03cf127a (/dev/sda1)

    other = cloud.build(amis={REGION: MOTO_XVDA_AMI}, facts=facts)
    seen = calls_of(other, ["RunInstances"])
    cloud.launch(other, offer(other, zone=ZONE))

    [sent] = seen["RunInstances"]
    assert sent["ImageId"] == MOTO_XVDA_AMI
    assert sent["BlockDeviceMappings"][0]["DeviceName"] == "/dev/xvda"


def test_what_discovery_cannot_find_is_named_in_the_facts_errors(cloud: Cloud) -> None:
    facts = cloud.build(gpu_amis={}).fetch_facts()  # moto has no Deep Learning AMI to find

    launch = facts.regions[REGION].launch
    assert launch is not None and set(launch.images) == {"cpu"}
    assert any(e.startswith(f"{REGION} gpu image: NoImage: found no NVIDIA-driver") for e in facts.errors)


def test_malformed_launch_facts_are_ignored_and_the_rest_kept(cloud: Cloud) -> None:
    raw = cloud.build().refresh_facts()
    raw["regions"][REGION]["launch"] = {"basis": "x", "images": "not a mapping"}  # type: ignore[index]

    facts = AccountFacts.from_json(raw)

    assert facts is not None and facts.regions[REGION].launch is None and facts.regions[REGION].zones
    compute = cloud.build(facts=raw)
    assert isinstance(compute, AwsCompute)
    cloud.launch(compute, offer(compute, zone=ZONE))


def _groups(cloud: Cloud) -> list[str]:
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=cloud.moto.url)
    found = ec2.describe_security_groups(Filters=[{"Name": "tag:trainyard:installation", "Values": [INSTALLATION]}])
    return [g["GroupId"] for g in found["SecurityGroups"]]

"""The aws backend's own behaviour on moto's server over HTTP (the contract
suite runs on it too: test_contract.py with the ``aws`` subject).

Every test uses the ``aws`` fixture: moto reset, boto3 pointed at it, and at
the end the check that no instance of ours is left running.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from backend.clouds.backends.aws.catalog import CATALOG_DATE, GIB, load_catalog
from backend.clouds.backends.aws.compute import AwsCompute
from backend.clouds.backends.aws.errors import compute_error
from backend.clouds.backends.aws.facts import AccountFacts
from backend.clouds.backends.aws.machines import cloud_state
from backend.clouds.backends.aws.session import forget_sessions, session_for
from backend.clouds.backends.base import (
    AccountConfig,
    CloudState,
    Gpu,
    Handle,
    LaunchSpec,
    Offer,
    Requirements,
    shortfall,
)
from backend.clouds.backends.errors import (
    AuthFailed,
    ComputeError,
    InvalidConfig,
    NoCapacity,
    QuotaExceeded,
    Scope,
    Transient,
)
from backend.clouds.backends.registry import compute_for
from tests.clouds.subjects import MOTO_SDA1_AMI, terminate_fully
from tests.support.moto import MotoServer

REGION = "us-east-1"
MOTO_XVDA_AMI = "ami-760aaa0f"  # moto's Amazon Linux image, root device /dev/xvda
INSTALLATION = "ty-aws-test"


@pytest.fixture
def cloud(aws: MotoServer) -> Iterator[Cloud]:
    made = Cloud(aws)
    yield made
    made.clean_up()


class Cloud:
    """Builds aws backends on moto and terminates what they launched."""

    def __init__(self, moto: MotoServer) -> None:
        self.moto = moto
        self.built: list[AwsCompute] = []
        self.launched: list[tuple[AwsCompute, Handle]] = []
        self.count = 0

    def build(self, *, installation: str = INSTALLATION, **config: Any) -> AwsCompute:
        account = AccountConfig(
            account_id="acct-1",
            workspace_id="ws-1",
            kind="aws",
            installation=installation,
            config={
                "regions": [REGION],
                "amis": {REGION: MOTO_SDA1_AMI},
                "gpu_amis": {REGION: MOTO_SDA1_AMI},
                **config,
            },
            credentials={"access_key_id": "testing", "secret_access_key": "testing"},
        )
        compute = compute_for(account)
        assert isinstance(compute, AwsCompute)
        self.built.append(compute)
        return compute

    def spec(self, key: str = "") -> LaunchSpec:
        self.count += 1
        key = key or f"ty-aws-{self.count}-{time.time_ns()}"
        return LaunchSpec(
            idempotency_key=key,
            instance_name=f"aws-{self.count}",
            runner_token="token",
            server_url="http://127.0.0.1:9",
            tags={"trainyard:workspace": "ws-1", "trainyard:instance": key, "Name": f"aws-{self.count}"},
            user_data="#!/bin/sh\necho hello\n",
        )

    def launch(self, compute: AwsCompute, offer: Offer, spec: LaunchSpec | None = None) -> Handle:
        handle = compute.launch(offer, spec or self.spec())
        self.launched.append((compute, handle))
        return handle

    def instance(self, handle: Handle) -> dict[str, Any]:
        answer = self.ec2().describe_instances(InstanceIds=[handle.backend_id])
        instance: dict[str, Any] = answer["Reservations"][0]["Instances"][0]
        return instance

    def ec2(self) -> Any:
        return boto3.client("ec2", region_name=REGION, endpoint_url=self.moto.url)

    def clean_up(self) -> None:
        for compute, handle in self.launched:
            terminate_fully(compute, handle)


def offer(compute: AwsCompute, instance_type: str = "m6i.large", *, spot: bool = False, zone: str = "") -> Offer:
    policy = "spot" if spot else "on-demand"
    found = [
        o
        for o in compute.offers(Requirements(spot_policy=policy))
        if o.instance_type == instance_type and o.zone == zone
    ]
    assert found, f"no offer {instance_type} {policy} {zone!r}"
    return found[0]


def calls(compute: AwsCompute, operation: str) -> list[dict[str, Any]]:
    """The parameters of every ``operation`` call made from now on (a botocore hook)."""
    return calls_of(compute, [operation])[operation]


def calls_of(compute: AwsCompute, operations: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``calls`` of each EC2 operation. On a new session: a client copies
    its session's hooks when it is made, and the clients made so far are
    kept with the old one."""
    seen: dict[str, list[dict[str, Any]]] = {operation: [] for operation in operations}
    forget_sessions()
    for operation, found in seen.items():

        def hook(params: dict[str, Any], found: list[dict[str, Any]] = found, **_: Any) -> None:
            found.append(dict(params))

        session_for(compute.auth).events.register(f"provide-client-params.ec2.{operation}", hook)
    return seen


# ------------------------------------------------------------------ launch settings


def test_launch_tags_the_instance_its_volume_and_its_network_interface(cloud: Cloud) -> None:
    compute = cloud.build()
    spec = cloud.spec()
    sent = calls(compute, "RunInstances")
    handle = cloud.launch(compute, offer(compute), spec)

    want = {
        "trainyard:key": spec.idempotency_key,
        "trainyard:installation": INSTALLATION,
        "trainyard:account": "acct-1",
        "trainyard:workspace": "ws-1",
        "trainyard:instance": spec.idempotency_key,
        "Name": spec.instance_name,
    }
    assert _tags(cloud.instance(handle)) == want
    volumes = cloud.ec2().describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [handle.backend_id]}])
    assert [_tags(volume) for volume in volumes["Volumes"]] == [want]
    # moto does not tag the network interface it makes; the request asks for it.
    asked = {s["ResourceType"]: _tags(s) for s in sent[0]["TagSpecifications"]}
    assert asked == {"instance": want, "volume": want, "network-interface": want}


def test_launch_requires_imdsv2_terminates_on_shutdown_and_has_no_instance_profile(cloud: Cloud) -> None:
    compute = cloud.build()
    handle = cloud.launch(compute, offer(compute))

    instance = cloud.instance(handle)
    assert instance["MetadataOptions"]["HttpTokens"] == "required"
    assert instance["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert instance["MetadataOptions"]["HttpEndpoint"] == "enabled"
    assert "IamInstanceProfile" not in instance
    behaviour = cloud.ec2().describe_instance_attribute(
        InstanceId=handle.backend_id, Attribute="instanceInitiatedShutdownBehavior"
    )
    assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"


@pytest.mark.parametrize(("ami", "device"), [(MOTO_SDA1_AMI, "/dev/sda1"), (MOTO_XVDA_AMI, "/dev/xvda")])
def test_the_root_volume_is_the_amis_root_device_gp3_deleted_on_termination(
    cloud: Cloud, ami: str, device: str
) -> None:
    compute = cloud.build(amis={REGION: ami})
    sent = calls(compute, "RunInstances")
    cheap = offer(compute, "m6i.large")

    handle = cloud.launch(compute, cheap)

    [mapping] = sent[0]["BlockDeviceMappings"]
    assert mapping == {
        "DeviceName": device,
        "Ebs": {"VolumeSize": 100, "VolumeType": "gp3", "DeleteOnTermination": True},
    }
    assert cheap.disk_bytes == 100 * GIB
    assert cloud.instance(handle)["RootDeviceName"] == device


def test_a_bigger_disk_requirement_makes_a_bigger_root_volume(cloud: Cloud) -> None:
    compute = cloud.build()
    sent = calls(compute, "RunInstances")
    [big] = [o for o in compute.offers(Requirements(disk_bytes=300 * GIB + 1)) if o.instance_type == "m6i.large"]

    cloud.launch(compute, big)

    assert big.disk_bytes == 301 * GIB
    assert sent[0]["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 301


def test_a_spot_offer_launches_a_one_time_spot_instance(cloud: Cloud) -> None:
    compute = cloud.build()
    sent = calls(compute, "RunInstances")

    handle = cloud.launch(compute, offer(compute, "g5.xlarge", spot=True))

    assert sent[0]["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
    }
    assert cloud.instance(handle)["InstanceLifecycle"] == "spot"
    assert handle.data["spot"] == "true"


def test_user_data_is_passed_as_it_is(cloud: Cloud) -> None:
    compute = cloud.build()
    spec = cloud.spec()
    handle = cloud.launch(compute, offer(compute), spec)

    answer = cloud.ec2().describe_instance_attribute(InstanceId=handle.backend_id, Attribute="userData")
    import base64

    assert base64.b64decode(answer["UserData"]["Value"]).decode() == spec.user_data


def test_one_security_group_per_vpc_is_created_once_and_reused(cloud: Cloud) -> None:
    first = cloud.build()
    a = cloud.launch(first, offer(first))
    again = cloud.build()  # another worker: no cache
    b = cloud.launch(again, offer(again))

    groups = cloud.ec2().describe_security_groups(
        Filters=[{"Name": "tag:trainyard:installation", "Values": [INSTALLATION]}]
    )["SecurityGroups"]
    assert len(groups) == 1
    [group] = groups
    assert group["IpPermissions"] == []
    assert _tags(group)["trainyard:sg"] == "runners"
    for handle in (a, b):
        assert [g["GroupId"] for g in cloud.instance(handle)["SecurityGroups"]] == [group["GroupId"]]


def test_a_second_launch_with_the_same_key_adopts_the_first_instance_by_tag(cloud: Cloud) -> None:
    compute = cloud.build()
    spec = cloud.spec()
    first = cloud.launch(compute, offer(compute), spec)
    sent = calls(compute, "RunInstances")

    second = cloud.build().launch(offer(compute), spec)

    assert second == first
    assert sent == []  # found by its tag: RunInstances was not called again


def test_run_instances_sends_the_key_as_client_token(cloud: Cloud) -> None:
    compute = cloud.build()
    spec = cloud.spec()
    sent = calls(compute, "RunInstances")

    cloud.launch(compute, offer(compute), spec)

    assert [call["ClientToken"] for call in sent] == [spec.idempotency_key]


def test_a_zoned_offer_launches_in_that_zone_by_its_id(cloud: Cloud) -> None:
    facts = cloud.build().fetch_facts()
    compute = cloud.build(facts=facts.to_json())
    zoned = offer(compute, "m6i.large", zone="use1-az1")

    handle = cloud.launch(compute, zoned)

    instance = cloud.instance(handle)
    assert instance["Placement"]["AvailabilityZone"] == "us-east-1b"  # moto's name for use1-az1
    subnet = cloud.ec2().describe_subnets(SubnetIds=[instance["SubnetId"]])["Subnets"][0]
    assert subnet["AvailabilityZoneId"] == "use1-az1"


# ------------------------------------------------------------------ errors


def test_insufficient_capacity_is_no_capacity_for_that_offer(cloud: Cloud) -> None:
    compute = cloud.build()
    cloud.moto.fault("RunInstances", "InsufficientInstanceCapacity", when={"InstanceType": "g5.xlarge"})

    with pytest.raises(NoCapacity) as caught:
        compute.launch(offer(compute, "g5.xlarge"), cloud.spec())

    assert (caught.value.code, caught.value.scope, caught.value.retry_after) == (
        "InsufficientInstanceCapacity",
        Scope.OFFER,
        180.0,
    )
    assert compute.list_managed() == []


def test_a_vcpu_limit_is_quota_exceeded_naming_the_quota(cloud: Cloud) -> None:
    compute = cloud.build()
    cloud.moto.fault("RunInstances", "VcpuLimitExceeded")

    with pytest.raises(QuotaExceeded) as caught:
        compute.launch(offer(compute, "g5.xlarge"), cloud.spec())

    assert (caught.value.code, caught.value.scope, caught.value.retry_after) == (
        "VcpuLimitExceeded",
        Scope.QUOTA,
        600.0,
    )
    assert caught.value.message.startswith(
        "the account's vCPU quota for G and VT instances in us-east-1 (On-Demand), quota code L-DB2E81BA"
    )


def test_unauthorized_is_auth_failed_naming_the_action(cloud: Cloud) -> None:
    compute = cloud.build()
    cloud.moto.fault(
        "RunInstances",
        "UnauthorizedOperation",
        message="You are not authorized. Encoded authorization failure message: xyz",
    )

    with pytest.raises(AuthFailed) as caught:
        compute.launch(offer(compute), cloud.spec())

    assert caught.value.scope == Scope.ACCOUNT
    assert "ec2:RunInstances in us-east-1" in caught.value.message
    assert "xyz" not in caught.value.message


def test_throttling_is_retried_with_the_same_token_then_succeeds(cloud: Cloud) -> None:
    compute = cloud.build()
    spec = cloud.spec()
    sent = calls(compute, "RunInstances")
    cloud.moto.fault("RunInstances", "RequestLimitExceeded", times=1)

    cloud.launch(compute, offer(compute), spec)

    assert [call["ClientToken"] for call in sent] == [spec.idempotency_key] * 2
    assert cloud.moto.fault_hits("RunInstances", "RequestLimitExceeded") == 1


def test_throttling_three_times_is_transient(cloud: Cloud) -> None:
    compute = cloud.build()
    cloud.moto.fault("RunInstances", "RequestLimitExceeded", times=3)

    with pytest.raises(Transient):
        compute.launch(offer(compute), cloud.spec())

    assert cloud.moto.fault_hits("RunInstances", "RequestLimitExceeded") == 3


def test_an_ami_ec2_does_not_know_is_invalid_config_naming_the_key(cloud: Cloud) -> None:
    compute = cloud.build(amis={REGION: "ami-00000000000000000"})

    with pytest.raises(InvalidConfig) as caught:
        compute.launch(offer(compute), cloud.spec())

    assert caught.value.code.startswith("InvalidAMIID")
    assert caught.value.scope == Scope.REGION
    assert "'amis'" in caught.value.message


def test_a_stale_cached_subnet_is_dropped_and_the_launch_tried_again(cloud: Cloud) -> None:
    compute = cloud.build()
    sent = calls(compute, "RunInstances")
    cloud.moto.fault("RunInstances", "InvalidSubnetID.NotFound", times=1)

    cloud.launch(compute, offer(compute))

    assert len(sent) == 2


def test_without_an_image_the_error_names_the_region_and_the_config_key(cloud: Cloud) -> None:
    compute = cloud.build(amis={})  # moto has no Ubuntu 22.04/24.04 image to find

    with pytest.raises(InvalidConfig) as caught:
        compute.launch(offer(compute), cloud.spec())

    assert caught.value.code == "NoImage"
    assert "us-east-1" in caught.value.message and "'amis'" in caught.value.message


@pytest.mark.parametrize(
    ("code", "kind", "scope", "retry_after"),
    [
        ("InsufficientInstanceCapacity", NoCapacity, Scope.OFFER, 180.0),
        ("InsufficientHostCapacity", NoCapacity, Scope.OFFER, 180.0),
        ("InsufficientFreeAddressesInSubnet", NoCapacity, Scope.ZONE, 180.0),
        ("SpotMaxPriceTooLow", NoCapacity, Scope.OFFER, 600.0),
        ("MaxSpotInstanceCountExceeded", QuotaExceeded, Scope.QUOTA, 600.0),
        ("InstanceLimitExceeded", QuotaExceeded, Scope.QUOTA, 600.0),
        ("Unsupported", NoCapacity, Scope.INSTANCE_TYPE, 86400.0),
        ("InvalidParameterCombination", NoCapacity, Scope.INSTANCE_TYPE, 3600.0),
        ("InvalidGroup.NotFound", InvalidConfig, Scope.REGION, None),
        ("AuthFailure", AuthFailed, Scope.ACCOUNT, None),
        ("Blocked", AuthFailed, Scope.ACCOUNT, None),
        ("OptInRequired", AuthFailed, Scope.REGION, None),
        ("InternalError", Transient, Scope.OFFER, 5.0),
        ("Unavailable", Transient, Scope.OFFER, 5.0),
    ],
)
def test_each_ec2_code_maps_to_its_error(
    cloud: Cloud, code: str, kind: type[ComputeError], scope: Scope, retry_after: float | None
) -> None:
    compute = cloud.build()
    cloud.moto.fault("RunInstances", code, times=5)

    with pytest.raises(kind) as caught:
        compute.launch(offer(compute, "g5.xlarge", spot=True), cloud.spec())

    assert (caught.value.code, caught.value.scope, caught.value.retry_after) == (code, scope, retry_after)
    assert "testing" not in str(caught.value)  # never a credential


def test_a_spot_quota_is_named_as_the_spot_quota() -> None:
    error = ClientError({"Error": {"Code": "MaxSpotInstanceCountExceeded", "Message": "no"}}, "RunInstances")

    mapped = compute_error(error, action="RunInstances", region="eu-west-1", instance_type="p4d.24xlarge", spot=True)

    assert mapped.message.startswith(
        "the account's vCPU quota for P instances in eu-west-1 (Spot), quota code L-7212CCBC"
    )


def test_connection_errors_and_timeouts_are_transient() -> None:
    for exc in (EndpointConnectionError(endpoint_url="http://x"), ReadTimeoutError(endpoint_url="http://x")):
        mapped = compute_error(exc, action="DescribeInstances", region=REGION)
        assert isinstance(mapped, Transient), exc


def test_an_unexpected_5xx_is_transient() -> None:
    error = ClientError(
        {"Error": {"Code": "Whatever", "Message": "boom"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "RunInstances"
    )
    assert isinstance(compute_error(error, action="RunInstances", region=REGION), Transient)


# ------------------------------------------------------------------ describe, terminate, list_managed


def test_an_id_not_visible_right_after_launch_is_pending(cloud: Cloud) -> None:
    compute = cloud.build()
    handle = cloud.launch(compute, offer(compute))
    cloud.moto.fault("DescribeInstances", "InvalidInstanceID.NotFound", times=2)  # the batch, then the id alone

    assert compute.describe([handle]) == {handle.key: CloudState.PENDING}
    assert compute.describe([handle]) == {handle.key: CloudState.RUNNING}


def test_an_unknown_id_launched_long_ago_is_not_found_and_terminating_it_succeeds(cloud: Cloud) -> None:
    compute = cloud.build()
    old = Handle(
        key="ty-old", backend_id="i-0123456789abcdef0", region=REGION, data={"launched_at": str(time.time() - 900)}
    )

    assert compute.describe([old]) == {"ty-old": CloudState.NOT_FOUND}
    compute.terminate(old)  # NotFound is success


def test_describe_batches_and_falls_back_per_id_when_one_is_unknown(cloud: Cloud) -> None:
    compute = cloud.build()
    handle = cloud.launch(compute, offer(compute))
    gone = Handle(key="ty-gone", backend_id="i-0123456789abcdef0", region=REGION)
    sent = calls(compute, "DescribeInstances")

    assert compute.describe([handle, gone]) == {handle.key: CloudState.RUNNING, "ty-gone": CloudState.NOT_FOUND}
    assert [call.get("InstanceIds") for call in sent] == [
        [handle.backend_id, gone.backend_id],
        [handle.backend_id],
        [gone.backend_id],
    ]


def test_terminate_is_idempotent_and_a_handle_without_id_finds_its_machine_by_tag(cloud: Cloud) -> None:
    compute = cloud.build()
    spec = cloud.spec()
    handle = compute.launch(offer(compute), spec)

    terminate_fully(compute, Handle(key=spec.idempotency_key))  # a row that never recorded the id
    terminate_fully(compute, handle)

    assert cloud.instance(handle)["State"]["Name"] == "terminated"
    assert compute.describe([handle]) == {handle.key: CloudState.TERMINATED}


def test_list_managed_ignores_untagged_instances_and_other_installations(cloud: Cloud) -> None:
    ours = cloud.build()
    theirs = cloud.build(installation="ty-someone-else")
    mine = cloud.launch(ours, offer(ours))
    other = cloud.launch(theirs, offer(theirs))
    untagged = cloud.ec2().run_instances(ImageId=MOTO_SDA1_AMI, MinCount=1, MaxCount=1, InstanceType="t3.micro")
    untagged_id = untagged["Instances"][0]["InstanceId"]
    try:
        managed = ours.list_managed()
        assert [(h.key, h.backend_id) for h in managed] == [(mine.key, mine.backend_id)]
        assert float(managed[0].data["launched_at"]) > time.time() - 300
        assert [h.backend_id for h in theirs.list_managed()] == [other.backend_id]
    finally:
        cloud.ec2().terminate_instances(InstanceIds=[untagged_id])


def test_a_reclaimed_spot_instance_is_interrupted() -> None:
    reclaimed = {
        "State": {"Name": "terminated"},
        "StateReason": {"Code": "Server.SpotInstanceTermination", "Message": "Server.SpotInstanceTermination"},
        "InstanceLifecycle": "spot",
    }
    ours = {"State": {"Name": "terminated"}, "StateReason": {"Code": "Client.UserInitiatedShutdown"}}

    assert cloud_state(reclaimed) is CloudState.INTERRUPTED
    assert cloud_state({**reclaimed, "State": {"Name": "shutting-down"}}) is CloudState.INTERRUPTED
    assert cloud_state(ours) is CloudState.TERMINATED
    assert cloud_state({"State": {"Name": "stopped"}}) is CloudState.STOPPING
    assert cloud_state({"State": {"Name": "weird"}}) is CloudState.NOT_FOUND


# ------------------------------------------------------------------ catalog and offers


def test_the_shipped_catalog_parses_into_offers(cloud: Cloud) -> None:
    rows = load_catalog()
    g5 = next(r for r in rows if (r.instance_type, r.region, r.spot) == ("g5.xlarge", REGION, False))
    p3 = next(r for r in rows if r.instance_type == "p3.16xlarge")
    regions = {r.region for r in rows}

    assert (g5.cpus, g5.memory_bytes, g5.gpus, g5.price_per_hour) == (4, 16 * GIB, (Gpu("A10G", 24 * GIB),), 1.006)
    assert (
        p3.flags == ("previous-generation",) and p3.gpus == (Gpu("V100-16GB", 16 * GIB),) * 8
    )  # gpuhunt's V100, by its exact model
    assert {"us-east-1", "us-west-2", "eu-west-1"} <= regions
    for kind in ("g4dn.12xlarge", "g5.48xlarge", "g6.xlarge", "g6e.xlarge", "p4d.24xlarge", "p5.48xlarge", "c7i.large"):
        assert {(r.region, r.spot) for r in rows if r.instance_type == kind} >= {(REGION, False), (REGION, True)}
    spot = next(r for r in rows if (r.instance_type, r.region, r.spot) == ("g5.xlarge", REGION, True))
    assert 0.3 * g5.price_per_hour <= spot.price_per_hour <= 0.4 * g5.price_per_hour
    assert len(CATALOG_DATE) == 8 and CATALOG_DATE.isdigit()


def test_offers_filter_by_region_spot_policy_max_price_and_gpu(cloud: Cloud) -> None:
    compute = cloud.build(regions=["us-east-1", "eu-west-1"])

    everything = list(compute.offers(Requirements(spot_policy="auto")))
    on_demand = list(compute.offers(Requirements()))
    spot_eu = list(compute.offers(Requirements(spot_policy="spot", regions=("eu-west-1",))))
    cheap = list(compute.offers(Requirements(max_price=0.1)))
    a100 = Requirements(gpu_count=8, gpu_name="A100")

    assert {o.region for o in everything} == {"us-east-1", "eu-west-1"}
    assert {o.spot for o in everything} == {True, False}
    assert not any(o.spot for o in on_demand)
    assert spot_eu and all(o.spot and o.region == "eu-west-1" for o in spot_eu)
    assert sorted({o.instance_type for o in cheap}) == ["c6i.large", "c7i.large", "m6i.large"]
    assert {o.instance_type for o in on_demand if shortfall(a100, o) is None} == {"p4d.24xlarge"}
    assert all(o.zone == "" for o in everything)  # no facts: per region, EC2 picks the zone
    assert len({o.offer_id for o in everything}) == len(everything)


def test_facts_split_offers_per_zone_and_drop_types_the_region_lacks(cloud: Cloud) -> None:
    facts = cloud.build().fetch_facts()
    stored = json.loads(json.dumps(facts.to_json()))  # what the services persist
    compute = cloud.build(facts=stored)

    g5 = [o for o in compute.offers(Requirements()) if o.instance_type == "g5.xlarge"]

    region = facts.regions[REGION]
    assert sorted(o.zone for o in g5) == sorted(region.offerings["g5.xlarge"])
    assert {o.zone for o in g5} <= set(region.zones)
    assert all(o.data["zone_name"] == region.zones[o.zone] for o in g5)
    assert "p3.2xlarge" not in region.offerings  # moto does not offer p3
    assert not [o for o in compute.offers(Requirements()) if o.instance_type.startswith("p3.")]
    assert AccountFacts.from_json(stored) == facts


def test_absurd_spot_prices_are_ignored_and_sane_ones_used(cloud: Cloud) -> None:
    facts = cloud.build().fetch_facts()  # moto's spot prices: 0.00001, dated 2006
    estimate = next(r for r in load_catalog() if (r.instance_type, r.region, r.spot) == ("g5.xlarge", REGION, True))

    assert facts.regions[REGION].spot_prices == {}
    spot = offer(cloud.build(facts=facts.to_json()), "g5.xlarge", spot=True, zone="use1-az1")
    assert (spot.price_per_hour, spot.data["price_source"]) == (estimate.price_per_hour, "catalog")

    raw = facts.to_json()
    raw["regions"][REGION]["spot_prices"] = {"g5.xlarge": {"use1-az1": 0.42}}  # type: ignore[index]
    live = offer(cloud.build(facts=raw), "g5.xlarge", spot=True, zone="use1-az1")
    assert (live.price_per_hour, live.data["price_source"]) == (0.42, "spot-history")

    stale = {**raw, "refreshed_at": time.time() - 2 * 86400}
    old = offer(cloud.build(facts=stale), "g5.xlarge", spot=True, zone="use1-az1")
    assert old.price_per_hour == estimate.price_per_hour


def test_refresh_facts_records_that_quotas_are_unknown(cloud: Cloud) -> None:
    facts = cloud.build().fetch_facts()

    assert facts.regions[REGION].quotas == {}
    assert any("quota" in error and "NoSuchResourceException" in error for error in facts.errors)
    assert time.time() - facts.refreshed_at < 60


def test_provision_timeout_is_longer_for_eight_gpus(cloud: Cloud) -> None:
    compute = cloud.build()

    assert AwsCompute.timings.provision_timeout == 600.0
    assert compute.provision_timeout_for(offer(compute, "g5.xlarge")) == 600.0
    assert compute.provision_timeout_for(offer(compute, "p5.48xlarge")) == 1500.0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"regions": []}, "'regions' must be a non-empty list"),
        ({"regions": ["mars-1"]}, "'regions' must be a list of AWS region names"),
        ({"regions": ["ap-south-1"]}, "has no instance types in ap-south-1"),
        ({"amis": {"us-east-1": "image-1"}}, "'amis.us-east-1' must be an id starting with 'ami-'"),
        ({"subnets": {"us-east-1": "subnet-1"}}, "'subnets.us-east-1' must be a list of ids"),
    ],
)
def test_bad_config_is_refused_when_the_backend_is_built(cloud: Cloud, config: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        cloud.build(**config)

    assert message in caught.value.message


def test_a_gpuhunt_catalog_file_replaces_the_shipped_one(cloud: Cloud, tmp_path: Path) -> None:
    path = tmp_path / "aws.csv"
    path.write_text(
        "instance_name,location,price,cpu,memory,gpu_count,gpu_name,gpu_memory,spot,disk_size,gpu_vendor,flags,cpu_arch,provider_data\n"
        'g5.xlarge,us-east-1,1.5,4,16.0,1,A10G,24.0,False,,nvidia,,x86,"{}"\n'
    )
    compute = cloud.build(catalog_file=str(path))

    [only] = compute.offers(Requirements(spot_policy="auto"))
    assert (only.instance_type, only.price_per_hour, only.disk_bytes) == ("g5.xlarge", 1.5, 200 * GIB)
    bad = tmp_path / "bad.csv"
    bad.write_text("instance_name,location\ng5.xlarge,us-east-1\n")
    with pytest.raises(InvalidConfig, match="lacks the columns"):
        cloud.build(catalog_file=str(bad))


def test_an_offer_for_a_region_it_does_not_serve_is_no_capacity(cloud: Cloud) -> None:
    compute = cloud.build()
    elsewhere = dataclasses.replace(offer(compute), region="eu-west-1")

    with pytest.raises(NoCapacity):
        compute.launch(elsewhere, cloud.spec())


def _tags(resource: dict[str, Any], key: str = "Tags") -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in resource.get(key, [])}

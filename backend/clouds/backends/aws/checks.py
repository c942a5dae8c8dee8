"""Checks that a connected AWS account can do what Trainyard needs, for real.

``check_account`` runs them in order and raises at the first problem, one
precise message per problem (``AuthFailed`` for credentials and permissions,
``InvalidConfig`` for a missing bucket, VPC or subnet), so nothing is saved
for an account that cannot work. Every call goes through ``session.client``
(timeouts, ``AWS_ENDPOINT_URL``). Plain Python: the services call it outside
any database transaction.

1. STS ``GetCallerIdentity`` (for a role: ``AssumeRole`` with the external
   id first, inside the session).
2. Per region: the configured subnets, or the default VPC's subnets, exist
   and have egress (their route table has a ``0.0.0.0/0`` route to an
   internet gateway or a NAT gateway): the runner dials out to the server.
3. The bucket: put, get and delete a small ``trainyard-check-<random>``
   object under the account's prefix.
4. Per region: ``RunInstances`` with ``DryRun`` and the tags machines carry
   (``DryRunOperation`` means allowed): the permission policy's tag
   conditions are exercised as at a real launch.

Error codes are read from botocore's ``ClientError`` here, for the messages
of this check only; mapping errors of compute calls is ``errors.py``'s job.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from backend.clouds.backends.aws.session import AwsAuth, client
from backend.clouds.backends.errors import AuthFailed, ComputeError, InvalidConfig, Scope, Transient

CHECK_INSTANCE_TYPE = "t3.micro"
# Denied-permission codes: EC2 says UnauthorizedOperation, moto (and S3, STS) AccessDenied.
DENIED = {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "Forbidden"}
BAD_KEYS = {"InvalidClientTokenId", "SignatureDoesNotMatch", "AuthFailure", "InvalidAccessKeyId", "UnrecognizedClient"}
TRANSIENT = {"Throttling", "ThrottlingException", "RequestLimitExceeded", "InternalError", "ServiceUnavailable"}
# Images the DryRun launch may use when the account configures none for a region.
CHECK_IMAGE_NAMES = ("al2023-ami-2023*-x86_64", "amzn2-ami-hvm-*-x86_64-gp2")
_X86 = {"Name": "architecture", "Values": ["x86_64"]}


@dataclass(frozen=True)
class CheckTarget:
    """What to check: where and how the account will be used."""

    auth: AwsAuth
    regions: tuple[str, ...]
    bucket: str
    prefix: str  # object keys of this account start with it ("trainyard/<workspace>/")
    subnets: Mapping[str, Sequence[str]] = field(default_factory=dict, hash=False)  # region → subnet ids
    amis: Mapping[str, str] = field(default_factory=dict, hash=False)  # region → image id for the dry run
    tags: Mapping[str, str] = field(default_factory=dict, hash=False)  # the tags a launch carries


@dataclass(frozen=True)
class Identity:
    account: str  # the 12-digit AWS account id
    arn: str  # who the server is in that account


def check_account(target: CheckTarget) -> Identity:
    """Every check of the module docstring, in order; the first problem
    raises ``AuthFailed`` / ``InvalidConfig`` (``Transient`` when AWS itself
    failed) with a message naming what is missing and where."""
    if not target.regions:
        raise InvalidConfig("the aws account names no regions; connect it again with --regions", code="NoRegions")
    identity = check_identity(target.auth, region=target.regions[0])
    for region in target.regions:
        subnet = check_network(target.auth, region=region, subnets=target.subnets.get(region, ()))
        check_launch(target, region=region, subnet=subnet)
    check_bucket(target.auth, region=target.regions[0], bucket=target.bucket, prefix=target.prefix)
    return identity


def check_identity(auth: AwsAuth, *, region: str) -> Identity:
    try:
        answer = client(auth, "sts", region).get_caller_identity()
    except ClientError as error:
        raise _identity_error(auth, error) from None
    except BotoCoreError as error:
        raise _unreachable("sts:GetCallerIdentity", region, error) from None
    return Identity(account=str(answer["Account"]), arn=str(answer["Arn"]))


def check_network(auth: AwsAuth, *, region: str, subnets: Sequence[str]) -> str:
    """The first usable subnet's id; ``InvalidConfig`` when none exists or
    one has no route out."""
    ec2 = client(auth, "ec2", region)
    found = _call(lambda: _subnets(ec2, region, subnets), "ec2:DescribeSubnets", region)
    routes = _call(lambda: _route_tables(ec2, found), "ec2:DescribeRouteTables", region)
    for subnet in found:
        table = routes.get(subnet["SubnetId"]) or routes.get("main:" + subnet["VpcId"])
        if not _has_egress(table):
            raise InvalidConfig(
                f"subnet {subnet['SubnetId']} in {region} has no route to the internet (no 0.0.0.0/0 route to an "
                "internet gateway or NAT gateway in its route table): machines there could not reach Trainyard; "
                "add the route or configure other subnets",
                code="NoEgress",
                scope=Scope.REGION,
            )
    return str(found[0]["SubnetId"])


def check_launch(target: CheckTarget, *, region: str, subnet: str) -> None:
    ec2 = client(target.auth, "ec2", region)
    image = target.amis.get(region) or _call(lambda: _check_image(ec2, region), "ec2:DescribeImages", region)
    tags = [{"Key": k, "Value": v} for k, v in target.tags.items()]
    try:
        ec2.run_instances(
            DryRun=True,
            ImageId=image,
            InstanceType=CHECK_INSTANCE_TYPE,
            MinCount=1,
            MaxCount=1,
            SubnetId=subnet,
            TagSpecifications=[
                {"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume", "network-interface")
            ],
        )
    except ClientError as error:
        code = _code(error)
        if code == "DryRunOperation":
            return
        if code in DENIED:
            raise AuthFailed(
                f"the AWS credentials may not launch machines in {region}: ec2:RunInstances was refused ({code}); "
                "attach Trainyard's permission policy (GET …/backends/aws/setup) to the role or user",
                code=code,
            ) from None
        raise _failed("ec2:RunInstances (dry run)", region, error) from None
    except BotoCoreError as error:
        raise _unreachable("ec2:RunInstances", region, error) from None
    raise InvalidConfig(f"the dry-run launch in {region} started a machine; this endpoint ignores DryRun")


def check_bucket(auth: AwsAuth, *, region: str, bucket: str, prefix: str) -> None:
    s3 = client(auth, "s3", region)
    key = f"{prefix}trainyard-check-{secrets.token_hex(8)}"
    body = secrets.token_bytes(16)
    for action, call in (
        ("s3:PutObject", lambda: s3.put_object(Bucket=bucket, Key=key, Body=body)),
        ("s3:GetObject", lambda: _read(s3, bucket, key, body)),
        ("s3:DeleteObject", lambda: s3.delete_object(Bucket=bucket, Key=key)),
    ):
        try:
            call()
        except ClientError as error:
            raise _bucket_error(bucket, key, action, error) from None
        except BotoCoreError as error:
            raise _unreachable(action, region, error) from None


# ------------------------------------------------------------------ helpers


def _identity_error(auth: AwsAuth, error: ClientError) -> ComputeError:
    code, message = _code(error), _message(error)
    if auth.role_arn:
        return AuthFailed(
            f"Trainyard could not assume role {auth.role_arn} ({code}: {message}); check that the role's trust "
            "policy names the server's principal and the external id shown by `trainyard backend add aws` "
            "(GET …/backends/aws/setup)",
            code=code,
        )
    if code in TRANSIENT:
        return Transient(f"AWS STS failed for now ({code}: {message}); try again", code=code)
    return AuthFailed(
        f"AWS rejected the access key {auth.access_key_id[:4]}…: {code} ({message}); check the key id and secret",
        code=code,
    )


def _subnets(ec2: Any, region: str, wanted: Sequence[str]) -> list[dict[str, Any]]:
    if wanted:
        try:
            found: list[dict[str, Any]] = ec2.describe_subnets(SubnetIds=list(wanted))["Subnets"]
        except ClientError as error:
            if _code(error).startswith("InvalidSubnetID"):
                raise InvalidConfig(
                    f"subnets {', '.join(wanted)} in {region}: {_message(error)} ({_code(error)})",
                    code=_code(error),
                    scope=Scope.REGION,
                ) from None
            raise
        return found
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise InvalidConfig(
            f"{region} has no default VPC: create one (aws ec2 create-default-vpc --region {region}) or name "
            "the subnets to use (--subnets)",
            code="NoDefaultVpc",
            scope=Scope.REGION,
        )
    vpc = vpcs[0]["VpcId"]
    subnets: list[dict[str, Any]] = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
    if not subnets:
        raise InvalidConfig(f"the default VPC {vpc} in {region} has no subnets", code="NoSubnets")
    return subnets


def _route_tables(ec2: Any, subnets: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Route table by subnet id, and each VPC's main table as ``main:<vpc>``
    (a subnet without an explicit association uses its VPC's main table)."""
    vpcs = sorted({s["VpcId"] for s in subnets})
    tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": vpcs}])["RouteTables"]
    by_subnet: dict[str, dict[str, Any]] = {}
    for table in tables:
        for association in table.get("Associations", []):
            if association.get("SubnetId"):
                by_subnet[association["SubnetId"]] = table
            if association.get("Main"):
                by_subnet["main:" + table["VpcId"]] = table
    return by_subnet


def _has_egress(table: Mapping[str, Any] | None) -> bool:
    for route in (table or {}).get("Routes", []):
        out = route.get("DestinationCidrBlock") == "0.0.0.0/0" and route.get("State", "active") == "active"
        gateway = str(route.get("GatewayId", ""))
        if out and (gateway.startswith("igw-") or route.get("NatGatewayId")):
            return True
    return False


def _check_image(ec2: Any, region: str) -> str:
    images = ec2.describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": list(CHECK_IMAGE_NAMES)}, _X86]
    )["Images"]
    if not images:
        raise InvalidConfig(
            f"no Amazon Linux image found in {region} for the dry-run launch; configure an AMI for {region}",
            code="NoImage",
        )
    newest = max(images, key=lambda image: str(image.get("CreationDate", "")))
    return str(newest["ImageId"])


def _read(s3: Any, bucket: str, key: str, body: bytes) -> None:
    read = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    if read != body:
        raise InvalidConfig(f"bucket {bucket} returned other bytes for {key} than were written", code="BadRead")


def _bucket_error(bucket: str, key: str, action: str, error: ClientError) -> ComputeError:
    code, message = _code(error), _message(error)
    if code == "NoSuchBucket":
        return InvalidConfig(
            f"bucket {bucket} does not exist (NoSuchBucket); create it in your account or name another with --bucket",
            code=code,
        )
    if code in DENIED:
        return AuthFailed(
            f"bucket {bucket}: {action} on {key} was refused ({code}); the policy must allow s3:PutObject, "
            f"s3:GetObject and s3:DeleteObject on arn:aws:s3:::{bucket}/{key.rsplit('/', 1)[0]}/*",
            code=code,
        )
    return InvalidConfig(f"bucket {bucket}: {action} on {key} failed ({code}: {message})", code=code)


def _call(fn: Any, action: str, region: str) -> Any:
    try:
        return fn()
    except ClientError as error:
        raise _failed(action, region, error) from None
    except BotoCoreError as error:
        raise _unreachable(action, region, error) from None


def _failed(action: str, region: str, error: ClientError) -> ComputeError:
    code, message = _code(error), _message(error)
    if code in DENIED:
        return AuthFailed(
            f"the AWS credentials may not call {action} in {region} ({code}); attach Trainyard's permission policy",
            code=code,
        )
    if code in BAD_KEYS:
        return AuthFailed(f"AWS rejected the credentials in {region}: {code} ({message})", code=code)
    if code == "OptInRequired":
        return AuthFailed(f"region {region} is not enabled for this AWS account ({code})", code=code)
    if code in TRANSIENT:
        return Transient(f"{action} in {region} failed for now ({code}: {message}); try again", code=code)
    return InvalidConfig(f"{action} in {region} failed: {code} ({message})", code=code)


def _unreachable(action: str, region: str, error: BotoCoreError) -> ComputeError:
    return Transient(f"{action} in {region}: AWS did not answer ({type(error).__name__}: {error})", code="Unreachable")


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", "") or "Unknown")


def _message(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Message", "") or "")

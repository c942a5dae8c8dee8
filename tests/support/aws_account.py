"""An AWS account on moto as a user would have it before connecting Trainyard.

moto's default VPCs have no internet gateway (real ones do): ``prepare``
gives each region's default VPC one, with the ``0.0.0.0/0`` route in its
main route table, and creates the artifacts bucket. ``iam_user`` makes an
IAM user with keys and an inline policy, for tests that switch moto's IAM
authentication on (``MotoServer.iam_auth``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import boto3

from tests.support.moto import MotoServer

BUCKET = "my-artifacts"
REGIONS = ("us-east-1", "eu-west-1")
EVERYTHING = ["sts:GetCallerIdentity", "ec2:*", "s3:*"]


def admin(server: MotoServer, service: str, region: str = "us-east-1") -> Any:
    return boto3.client(
        service,
        region_name=region,
        endpoint_url=server.url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def prepare(server: MotoServer, *, regions: Sequence[str] = REGIONS, bucket: str | None = BUCKET) -> None:
    for region in regions:
        give_internet(server, region)
    if bucket:
        admin(server, "s3").create_bucket(Bucket=bucket)


def give_internet(server: MotoServer, region: str) -> str:
    """An internet gateway on the region's default VPC, routed from its main table."""
    ec2 = admin(server, "ec2", region)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    gateway = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=gateway, VpcId=vpc)
    table = main_route_table(server, region)
    ec2.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", GatewayId=gateway)
    return gateway


def main_route_table(server: MotoServer, region: str) -> str:
    ec2 = admin(server, "ec2", region)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    tables = ec2.describe_route_tables(
        Filters=[{"Name": "vpc-id", "Values": [vpc]}, {"Name": "association.main", "Values": ["true"]}]
    )["RouteTables"]
    return str(tables[0]["RouteTableId"])


def iam_user(server: MotoServer, name: str, actions: Sequence[str] = EVERYTHING) -> tuple[str, str]:
    """(access key id, secret) of a new IAM user allowed ``actions`` on everything."""
    iam = admin(server, "iam")
    iam.create_user(UserName=name)
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": list(actions), "Resource": "*"}]}
    iam.put_user_policy(UserName=name, PolicyName="trainyard", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


def bucket_keys(server: MotoServer, bucket: str = BUCKET) -> list[str]:
    answer = admin(server, "s3").list_objects_v2(Bucket=bucket)
    return [str(o["Key"]) for o in answer.get("Contents", [])]

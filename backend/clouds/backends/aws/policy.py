"""The IAM documents a connected AWS account needs: the one source of truth.

``permission_policy`` is what the role (or user) may do: least privilege,
each statement commented in docs/AWS.md. ``trust_policy`` lets
the server's principal assume the role with the workspace's external id.
``deploy/aws/policy.json``, ``deploy/aws/role.yaml`` (CloudFormation) and
``deploy/aws/role.tf.json`` (Terraform) are generated from here with ``python -m backend.clouds.backends.aws.policy``;
a test fails when they are stale (docs/decisions/0022-aws-external-id.md).

Placeholders use CloudFormation's ``${Name}`` syntax, so the same text is a
``Fn::Sub`` string in the template and is filled in by ``render`` for the
setup endpoint.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

INSTALLATION_TAG = "trainyard:installation"
PLACEHOLDERS = ("BucketName", "Prefix", "InstallationId", "DataBucket", "OutputBucket")
# The statements on buckets the user names for ``inputs:`` (read) and for
# artifacts' ``to:`` (write); each names one bucket or a pattern (``acme-*``),
# never every bucket. Left out of a rendered policy that names none.
NAMED_BUCKET_SIDS = {
    "DataBucket": ("ReadNamedDataBuckets", "ReadNamedDataObjects"),
    "OutputBucket": ("WriteOutputsToNamedBuckets",),
}

# The EC2 reads the backend makes (checks, offers, describe, leak sweep).
DESCRIBE_ACTIONS = (
    "ec2:DescribeInstances",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeSpotPriceHistory",
    "ec2:DescribeAvailabilityZones",
    "ec2:DescribeVpcs",
    "ec2:DescribeSubnets",
    "ec2:DescribeRouteTables",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeVolumes",
)
_EC2 = "arn:aws:ec2:*:*:"
_OURS = {"StringEquals": {f"aws:ResourceTag/{INSTALLATION_TAG}": "${InstallationId}"}}
_TAGGED_AT_CREATION = {"StringEquals": {f"aws:RequestTag/{INSTALLATION_TAG}": "${InstallationId}"}}

PERMISSION_POLICY: dict[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Sid": "LaunchTaggedMachines",
            "Effect": "Allow",
            "Action": ["ec2:RunInstances"],
            "Resource": [f"{_EC2}instance/*", f"{_EC2}volume/*", f"{_EC2}network-interface/*"],
            "Condition": _TAGGED_AT_CREATION,
        },
        {
            "Sid": "LaunchFromImagesAndSubnets",
            "Effect": "Allow",
            "Action": ["ec2:RunInstances"],
            "Resource": [
                "arn:aws:ec2:*::image/*",
                "arn:aws:ec2:*::snapshot/*",
                f"{_EC2}subnet/*",
                f"{_EC2}security-group/*",
            ],
        },
        {
            "Sid": "TagOnlyAtCreation",
            "Effect": "Allow",
            "Action": ["ec2:CreateTags"],
            "Resource": [
                f"{_EC2}instance/*",
                f"{_EC2}volume/*",
                f"{_EC2}network-interface/*",
                f"{_EC2}security-group/*",
            ],
            "Condition": {
                "StringEquals": {"ec2:CreateAction": ["RunInstances", "CreateSecurityGroup", "CreateVolume"]}
            },
        },
        {
            "Sid": "TerminateOnlyOurMachines",
            "Effect": "Allow",
            "Action": ["ec2:TerminateInstances"],
            "Resource": [f"{_EC2}instance/*"],
            "Condition": _OURS,
        },
        {
            "Sid": "CreateTaggedVolumes",
            "Effect": "Allow",
            "Action": ["ec2:CreateVolume"],
            "Resource": [f"{_EC2}volume/*"],
            "Condition": _TAGGED_AT_CREATION,
        },
        {
            "Sid": "AttachAndDeleteOnlyOurVolumes",
            "Effect": "Allow",
            "Action": ["ec2:AttachVolume", "ec2:DetachVolume", "ec2:DeleteVolume"],
            "Resource": [f"{_EC2}volume/*"],
            "Condition": _OURS,
        },
        {
            "Sid": "AttachToOurMachines",
            "Effect": "Allow",
            "Action": ["ec2:AttachVolume", "ec2:DetachVolume"],
            "Resource": [f"{_EC2}instance/*"],
            "Condition": _OURS,
        },
        {
            "Sid": "CreateTaggedSecurityGroup",
            "Effect": "Allow",
            "Action": ["ec2:CreateSecurityGroup"],
            "Resource": [f"{_EC2}security-group/*"],
            "Condition": _TAGGED_AT_CREATION,
        },
        {
            "Sid": "CreateSecurityGroupInVpc",
            "Effect": "Allow",
            "Action": ["ec2:CreateSecurityGroup"],
            "Resource": [f"{_EC2}vpc/*"],
        },
        {
            "Sid": "EgressOfOurSecurityGroup",
            "Effect": "Allow",
            "Action": ["ec2:AuthorizeSecurityGroupEgress"],
            "Resource": [f"{_EC2}security-group/*"],
            "Condition": _OURS,
        },
        {"Sid": "Describe", "Effect": "Allow", "Action": list(DESCRIBE_ACTIONS), "Resource": "*"},
        {
            "Sid": "ArtifactsUnderPrefix",
            "Effect": "Allow",
            "Action": [
                "s3:PutObject",
                "s3:GetObject",
                "s3:DeleteObject",
                "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts",
            ],
            "Resource": ["arn:aws:s3:::${BucketName}/${Prefix}*"],
        },
        {
            "Sid": "ListUnderPrefix",
            "Effect": "Allow",
            "Action": ["s3:ListBucket", "s3:ListBucketMultipartUploads"],
            "Resource": ["arn:aws:s3:::${BucketName}"],
            "Condition": {"StringLike": {"s3:prefix": ["${Prefix}*"]}},
        },
        {
            "Sid": "BucketRegion",
            "Effect": "Allow",
            "Action": ["s3:GetBucketLocation"],
            "Resource": ["arn:aws:s3:::${BucketName}"],
        },
        {"Sid": "ReadQuotas", "Effect": "Allow", "Action": ["servicequotas:GetServiceQuota"], "Resource": "*"},
        {
            "Sid": "ReadNamedDataBuckets",
            "Effect": "Allow",
            "Action": ["s3:ListBucket", "s3:ListBucketVersions", "s3:GetBucketVersioning", "s3:GetBucketLocation"],
            "Resource": ["arn:aws:s3:::${DataBucket}"],
        },
        {
            "Sid": "ReadNamedDataObjects",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:GetObjectVersion"],
            "Resource": ["arn:aws:s3:::${DataBucket}/*"],
        },
        {
            "Sid": "WriteOutputsToNamedBuckets",
            "Effect": "Allow",
            "Action": ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
            "Resource": ["arn:aws:s3:::${OutputBucket}/*"],
        },
    ],
}

TRUST_POLICY: dict[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"AWS": "${TrustedPrincipalArn}"},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"sts:ExternalId": "${ExternalId}"}},
        }
    ],
}


def render(document: Mapping[str, Any], values: Mapping[str, str]) -> dict[str, Any]:
    """``document`` with every ``${Name}`` replaced by ``values[Name]``."""
    text = json.dumps(document)
    for name, value in values.items():
        text = text.replace("${" + name + "}", json.dumps(value)[1:-1])
    rendered: dict[str, Any] = json.loads(text)
    return rendered


def permission_policy(
    *, bucket: str, prefix: str, installation: str, data_bucket: str = "", output_bucket: str = ""
) -> dict[str, Any]:
    """The policy for these values; the statements of a named bucket that is
    not given ("") are left out."""
    named = {"DataBucket": data_bucket, "OutputBucket": output_bucket}
    left_out = {sid for name, sids in NAMED_BUCKET_SIDS.items() if not named[name] for sid in sids}
    document = {
        **PERMISSION_POLICY,
        "Statement": [st for st in PERMISSION_POLICY["Statement"] if st["Sid"] not in left_out],
    }
    values = {"BucketName": bucket, "Prefix": prefix, "InstallationId": installation}
    return render(document, {**values, **{k: v for k, v in named.items() if v}})


def trust_policy(*, principal: str, external_id: str) -> dict[str, Any]:
    return render(TRUST_POLICY, {"TrustedPrincipalArn": principal, "ExternalId": external_id})


def policy_json() -> str:
    """``deploy/aws/policy.json``."""
    return json.dumps(PERMISSION_POLICY, indent=2) + "\n"


def role_template() -> str:
    """``deploy/aws/role.yaml``: a CloudFormation template (JSON is YAML)
    creating the role with both documents and the parameters they name."""
    template = {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": "The IAM role Trainyard assumes to run machines and store artifacts in this account.",
        "Parameters": {
            "TrustedPrincipalArn": {"Type": "String", "Description": "The Trainyard server's AWS principal"},
            "ExternalId": {"Type": "String", "MinLength": 2, "Description": "Your workspace's external id"},
            "InstallationId": {"Type": "String", "Description": "The trainyard:installation tag of the server"},
            "BucketName": {"Type": "String", "Description": "The bucket for artifacts and checkpoints"},
            "Prefix": {"Type": "String", "Default": "trainyard/", "Description": "Key prefix Trainyard may use"},
            "DataBucket": {
                "Type": "String",
                "AllowedPattern": "[a-z0-9.*-]*[a-z0-9.-][a-z0-9.*-]*",
                "Description": "The bucket (or pattern, e.g. acme-data-*) jobs read inputs from; not * alone",
            },
            "OutputBucket": {
                "Type": "String",
                "AllowedPattern": "[a-z0-9.*-]*[a-z0-9.-][a-z0-9.*-]*",
                "Description": "The bucket (or pattern, e.g. acme-models-*) artifacts are copied to (to:); not * alone",
            },
        },
        "Resources": {
            "TrainyardRole": {
                "Type": "AWS::IAM::Role",
                "Properties": {
                    "AssumeRolePolicyDocument": _substituted(TRUST_POLICY),
                    "Policies": [{"PolicyName": "trainyard", "PolicyDocument": _substituted(PERMISSION_POLICY)}],
                },
            }
        },
        "Outputs": {"RoleArn": {"Value": {"Fn::GetAtt": ["TrainyardRole", "Arn"]}}},
    }
    header = "# Generated by `python -m backend.clouds.backends.aws.policy`; do not edit.\n"
    return header + json.dumps(template, indent=2) + "\n"


# The Terraform variable of each placeholder (the CloudFormation parameters' names, in snake case).
TERRAFORM_VARIABLES = {
    "TrustedPrincipalArn": "trusted_principal_arn",
    "ExternalId": "external_id",
    "InstallationId": "installation_id",
    "BucketName": "bucket_name",
    "Prefix": "prefix",
    "DataBucket": "data_bucket",
    "OutputBucket": "output_bucket",
}


def terraform_json() -> str:
    """``deploy/aws/role.tf.json``: the same role for Terraform (its JSON
    syntax), both documents with each ``${Name}`` as ``${var.name}``."""
    parameters = json.loads(role_template().split("\n", 1)[1])["Parameters"]
    variables: dict[str, Any] = {}
    for name, parameter in parameters.items():
        variable = {"type": "string", "description": parameter["Description"]}
        if "Default" in parameter:
            variable["default"] = parameter["Default"]
        variables[TERRAFORM_VARIABLES[name]] = variable

    def document(doc: Mapping[str, Any]) -> str:
        text = json.dumps(doc)
        for name, var in TERRAFORM_VARIABLES.items():
            text = text.replace("${" + name + "}", "${var." + var + "}")
        return text

    config = {
        "//": "Generated by `python -m backend.clouds.backends.aws.policy`; do not edit.",
        "variable": variables,
        "resource": {
            "aws_iam_role": {"trainyard": {"name_prefix": "trainyard-", "assume_role_policy": document(TRUST_POLICY)}},
            "aws_iam_role_policy": {
                "trainyard": {
                    "name": "trainyard",
                    "role": "${aws_iam_role.trainyard.id}",
                    "policy": document(PERMISSION_POLICY),
                }
            },
        },
        "output": {"role_arn": {"value": "${aws_iam_role.trainyard.arn}"}},
    }
    return json.dumps(config, indent=2) + "\n"


def unsubstituted(node: Any) -> Any:
    """``role.yaml``'s document with each ``{"Fn::Sub": s}`` back to ``s``."""
    if isinstance(node, dict):
        if set(node) == {"Fn::Sub"}:
            return node["Fn::Sub"]
        return {k: unsubstituted(v) for k, v in node.items()}
    if isinstance(node, list):
        return [unsubstituted(v) for v in node]
    return node


def _substituted(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _substituted(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_substituted(v) for v in node]
    if isinstance(node, str) and "${" in node:
        return {"Fn::Sub": node}
    return node


def main(deploy_dir: Path) -> None:
    deploy_dir.mkdir(parents=True, exist_ok=True)
    (deploy_dir / "policy.json").write_text(policy_json())
    (deploy_dir / "role.yaml").write_text(role_template())
    (deploy_dir / "role.tf.json").write_text(terraform_json())


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[4] / "deploy" / "aws")

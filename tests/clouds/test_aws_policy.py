"""The IAM documents: deploy/aws/ is generated from backend/clouds/backends/aws/policy.py
and allows every AWS call the aws backend makes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from backend.clouds.backends.aws import policy

ROOT = Path(__file__).resolve().parents[2]
AWS_CODE = ROOT / "backend" / "clouds" / "backends" / "aws"
CALL = re.compile(r"\b(ec2|s3|sts|quotas|servicequotas)\.([a-z][a-z0-9_]+)\(")
SERVICES = {"ec2": "ec2", "s3": "s3", "sts": "sts", "quotas": "servicequotas", "servicequotas": "servicequotas"}
# boto3 methods whose IAM action is not their own name.
S3_ACTIONS = {
    "create_multipart_upload": "s3:PutObject",
    "upload_part": "s3:PutObject",
    "complete_multipart_upload": "s3:PutObject",
    "head_object": "s3:GetObject",
    "list_objects_v2": "s3:ListBucket",
    "list_parts": "s3:ListMultipartUploadParts",
    "abort_multipart_upload": "s3:AbortMultipartUpload",
    "generate_presigned_url": "",
    "get_paginator": "",
}
# GetCallerIdentity needs no permission; AssumeRole is the server's own call, allowed by the trust policy.
NEEDS_NO_PERMISSION = {"sts:GetCallerIdentity", "sts:AssumeRole"}


def _action(service: str, method: str) -> str:
    if service == "s3" and method in S3_ACTIONS:
        return S3_ACTIONS[method]
    if method == "get_paginator":
        return ""
    return f"{SERVICES[service]}:" + "".join(part.capitalize() for part in method.split("_"))


def _allowed() -> set[str]:
    actions: set[str] = set()
    for statement in policy.PERMISSION_POLICY["Statement"]:
        assert statement["Effect"] == "Allow"
        actions.update([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    return actions


def test_the_deploy_files_are_generated_from_the_python_source() -> None:
    regenerate = "regenerate with: python -m backend.clouds.backends.aws.policy"
    assert (ROOT / "deploy/aws/policy.json").read_text() == policy.policy_json(), regenerate
    assert (ROOT / "deploy/aws/role.yaml").read_text() == policy.role_template(), regenerate
    assert (ROOT / "deploy/aws/role.tf.json").read_text() == policy.terraform_json(), regenerate


def test_the_terraform_role_carries_the_same_documents_with_a_variable_for_each_parameter() -> None:
    config = json.loads((ROOT / "deploy/aws/role.tf.json").read_text())
    template = yaml.safe_load((ROOT / "deploy/aws/role.yaml").read_text())
    role = config["resource"]["aws_iam_role"]["trainyard"]
    permissions = config["resource"]["aws_iam_role_policy"]["trainyard"]

    def as_parameters(text: str) -> object:
        for name, var in policy.TERRAFORM_VARIABLES.items():
            text = text.replace("${var." + var + "}", "${" + name + "}")
        return json.loads(text)

    assert as_parameters(permissions["policy"]) == policy.PERMISSION_POLICY
    assert as_parameters(role["assume_role_policy"]) == policy.TRUST_POLICY
    assert permissions["role"] == "${aws_iam_role.trainyard.id}"
    used = set(re.findall(r"\$\{var\.(\w+)\}", json.dumps(config)))
    assert used == set(config["variable"]) == {policy.TERRAFORM_VARIABLES[p] for p in template["Parameters"]}
    assert "${DataBucket}" not in json.dumps(config)


def test_the_cloudformation_role_carries_the_same_documents() -> None:
    template = yaml.safe_load((ROOT / "deploy/aws/role.yaml").read_text())
    role = template["Resources"]["TrainyardRole"]["Properties"]

    assert policy.unsubstituted(role["Policies"][0]["PolicyDocument"]) == policy.PERMISSION_POLICY
    assert policy.unsubstituted(role["AssumeRolePolicyDocument"]) == policy.TRUST_POLICY
    used = set(re.findall(r"\$\{(\w+)\}", json.dumps(role)))
    assert used == set(template["Parameters"])


def test_the_policy_allows_every_call_the_aws_backend_makes_and_no_more_than_it_names() -> None:
    calls = {
        _action(service, method) for path in AWS_CODE.glob("*.py") for service, method in CALL.findall(path.read_text())
    } - {""}
    allowed = _allowed()

    assert calls - NEEDS_NO_PERMISSION <= allowed, sorted(calls - NEEDS_NO_PERMISSION - allowed)
    assert {"ec2:RunInstances", "ec2:DescribeSubnets", "ec2:DescribeRouteTables", "s3:PutObject"} <= calls
    assert not any("*" in action for action in allowed)
    assert not {a for a in allowed if a.startswith("iam:")}  # no PassRole, no instance profile


def test_terminate_and_tagging_are_limited_to_our_machines_and_to_launch() -> None:
    by_sid = {s["Sid"]: s for s in policy.PERMISSION_POLICY["Statement"]}

    assert by_sid["TerminateOnlyOurMachines"]["Condition"] == {
        "StringEquals": {"aws:ResourceTag/trainyard:installation": "${InstallationId}"}
    }
    assert by_sid["TagOnlyAtCreation"]["Condition"] == {
        "StringEquals": {"ec2:CreateAction": ["RunInstances", "CreateSecurityGroup", "CreateVolume"]}
    }
    for sid in ("AttachAndDeleteOnlyOurVolumes", "AttachToOurMachines"):
        assert by_sid[sid]["Condition"] == by_sid["TerminateOnlyOurMachines"]["Condition"]
    rendered = policy.permission_policy(bucket="b-1", prefix="trainyard/", installation="ty-abc")
    assert "${" not in json.dumps(rendered)
    assert json.dumps(rendered).count("ty-abc") == 7

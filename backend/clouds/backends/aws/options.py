"""The aws backend's config keys, read and checked once (docs/BACKENDS.md, "The aws backend").

``regions`` (list of str, required)
    Where machines may run; offers come only from these.
``amis`` / ``gpu_amis`` ({region: ami-id}; optional)
    The image for CPU / GPU offers in a region. Without one, the newest
    Canonical Ubuntu 24.04/22.04 image (CPU) or AWS Deep Learning Base OSS
    Nvidia Driver GPU AMI (GPU) is looked up.
``subnets`` ({region: [subnet-id, …]}; optional)
    Launch only into these subnets (one in the offer's zone). Without them:
    the subnets of ``vpc_ids[region]``, else the region's default VPC.
``vpc_ids`` ({region: vpc-id}; optional)
``bucket`` (str; optional): the artifact bucket (the S3 storage reads it).
``catalog_file`` (str; optional): a gpuhunt-layout ``aws.csv`` instead of the shipped one.
``facts`` (object; optional): the account facts the services stored (``facts.py``).
``role_arn`` / ``external_id``: how to get in (``session.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from backend.clouds.backends.base import AccountConfig
from backend.clouds.backends.errors import InvalidConfig

REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")


@dataclass(frozen=True)
class AwsOptions:
    regions: tuple[str, ...]
    amis: Mapping[str, str] = field(default_factory=dict)
    gpu_amis: Mapping[str, str] = field(default_factory=dict)
    subnets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    vpc_ids: Mapping[str, str] = field(default_factory=dict)
    bucket: str = ""
    catalog_file: Path | None = None

    @classmethod
    def of(cls, account: AccountConfig) -> AwsOptions:
        config = account.config
        regions = config.get("regions")
        if not isinstance(regions, list | tuple) or not regions or not all(isinstance(r, str) for r in regions):
            raise _invalid("regions", 'a non-empty list of region names such as ["us-east-1"]', regions)
        for region in regions:
            if not REGION.match(region):
                raise _invalid("regions", 'a list of AWS region names such as "us-east-1"', region)
        bucket = config.get("bucket", "")
        if not isinstance(bucket, str):
            raise _invalid("bucket", "a bucket name", bucket)
        catalog_file = config.get("catalog_file")
        if catalog_file is not None and not (isinstance(catalog_file, str) and catalog_file):
            raise _invalid("catalog_file", "the path of a CSV file", catalog_file)
        return cls(
            regions=tuple(regions),
            amis=_strings(config, "amis", "ami-"),
            gpu_amis=_strings(config, "gpu_amis", "ami-"),
            subnets=_lists(config, "subnets", "subnet-"),
            vpc_ids=_strings(config, "vpc_ids", "vpc-"),
            bucket=bucket,
            catalog_file=Path(catalog_file) if catalog_file else None,
        )


def _strings(config: Mapping[str, object], key: str, prefix: str) -> dict[str, str]:
    raw = config.get(key) or {}
    expected = f'an object of region → id, such as {{"us-east-1": "{prefix}0123456789abcdef0"}}'
    if not isinstance(raw, Mapping):
        raise _invalid(key, expected, raw)
    for region, value in raw.items():
        if not isinstance(value, str) or not value.startswith(prefix):
            raise _invalid(f"{key}.{region}", f"an id starting with {prefix!r}", value)
    return {str(region): str(value) for region, value in raw.items()}


def _lists(config: Mapping[str, object], key: str, prefix: str) -> dict[str, tuple[str, ...]]:
    raw = config.get(key) or {}
    if not isinstance(raw, Mapping):
        raise _invalid(key, f'an object of region → list of ids, such as {{"us-east-1": ["{prefix}…"]}}', raw)
    found: dict[str, tuple[str, ...]] = {}
    for region, values in raw.items():
        if not isinstance(values, list | tuple) or not all(isinstance(v, str) and v.startswith(prefix) for v in values):
            raise _invalid(f"{key}.{region}", f"a list of ids starting with {prefix!r}", values)
        found[str(region)] = tuple(values)
    return found


def _invalid(key: str, expected: str, value: object) -> InvalidConfig:
    return InvalidConfig(f"the aws backend's config key {key!r} must be {expected}, not {value!r}", code="BadConfig")

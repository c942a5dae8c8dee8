"""Through what the server reads a workspace's ``s3://`` data.

In order: the workspace's active AWS account (its role or keys, as for its
machines), else its S3-compatible endpoint (``DataEndpoint``), else no
credentials at all (a public bucket). The same client lists an input when
its run is submitted and presigns the URLs the runner downloads from, so a
bucket the account cannot read is refused at submission.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from botocore.exceptions import BotoCoreError, ClientError

from backend.clouds.backends.aws import session as aws_session
from backend.clouds.models import AccountStatus, BackendKind, CloudAccount
from backend.clouds.services.accounts import account_config
from backend.data.models import DataEndpoint
from backend.vault.crypto import decrypt

# Buckets whose region was looked up, per source (a bucket does not move).
_REGIONS_MAX = 1000
_regions: dict[tuple[str, str], str] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class S3Access:
    client: Any  # a boto3 S3 client, in the bucket's region where that could be learnt
    source: str  # "aws:<account id>" | "endpoint:<url>" | "anonymous"
    # Who asks, in words, for a message about a refused request ("the AWS account
    # 123456789012 (role arn:aws:iam::…)", "the data endpoint https://…").
    principal: str = ""


def s3_access(*, workspace_id: UUID | str, bucket: str) -> S3Access:
    """How the workspace reads ``bucket``. Raises ``InvalidConfig`` (from the
    AWS session) when its AWS account has neither role nor keys."""
    account = (
        CloudAccount.objects.filter(workspace_id=workspace_id, kind=BackendKind.AWS, status=AccountStatus.ACTIVE)
        .order_by("created_at")
        .first()
    )
    if account is not None:
        config = account_config(account)
        auth = aws_session.auth_of(config)
        aws_id = str(config.config.get("aws_account_id") or account.pk)
        regions = config.config.get("regions")
        default_region = str(regions[0]) if isinstance(regions, list) and regions else aws_session.WARM_REGION
        source = f"aws:{aws_id}"
        region = _bucket_region(source, bucket, aws_session.client(auth, "s3", default_region), default_region)
        who = f"the AWS account {aws_id}" + (f" (role {auth.role_arn})" if auth.role_arn else " (its access keys)")
        return S3Access(client=aws_session.client(auth, "s3", region), source=source, principal=who)
    endpoint = DataEndpoint.objects.filter(workspace_id=workspace_id).first()
    if endpoint is not None:
        secret = decrypt(bytes(endpoint.secret_access_key_ciphertext)) if endpoint.secret_access_key_ciphertext else ""
        client = aws_session.endpoint_client(
            endpoint_url=endpoint.endpoint_url,
            access_key_id=endpoint.access_key_id,
            secret_access_key=secret,
            region=endpoint.region,
        )
        who = f"the data endpoint {endpoint.endpoint_url} (key {endpoint.access_key_id[:4]}…)"
        return S3Access(client=client, source=f"endpoint:{endpoint.endpoint_url}", principal=who)
    client = aws_session.anonymous_client(aws_session.WARM_REGION)
    region = _bucket_region("anonymous", bucket, client, aws_session.WARM_REGION)
    if region != aws_session.WARM_REGION:
        client = aws_session.anonymous_client(region)
    return S3Access(
        client=client,
        source="anonymous",
        principal="an anonymous request (the workspace has no AWS account and no data endpoint)",
    )


def _bucket_region(source: str, bucket: str, client: Any, default: str) -> str:
    """The bucket's region (S3 says it in ``x-amz-bucket-region``, even when
    it refuses the request), else ``default``."""
    key = (source, bucket)
    with _lock:
        found = _regions.get(key)
    if found:
        return found
    region = ""
    try:
        answer = client.head_bucket(Bucket=bucket)
        region = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region", "")
    except ClientError as e:
        region = e.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region", "")
    except BotoCoreError:
        region = ""
    if not region:
        return default
    with _lock:
        if len(_regions) >= _REGIONS_MAX:
            _regions.clear()
        _regions[key] = region
    return region

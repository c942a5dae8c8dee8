"""Which storage holds an object, and where a workspace's new objects go.

A workspace with an active AWS connection whose config names a ``bucket``
stores new blobs and artifacts in that bucket; any other workspace uses the
installation's local storage. Every Blob and Artifact records where it was
stored (``storage_account``, ``storage_bucket``), so connecting, changing or
breaking an account never orphans what is already stored: old objects are
read where they are, with the credentials of the account that stored them.

artifacts imports clouds here (accounts and their credentials), never the
reverse (docs/decisions/0025-storage-per-workspace.md).
"""

from __future__ import annotations

from typing import Protocol
from uuid import UUID

from backend.artifacts.s3 import S3Storage
from backend.artifacts.storage import Storage, get_storage
from backend.clouds.backends.aws.session import auth_of
from backend.clouds.backends.errors import InvalidConfig
from backend.clouds.models import AccountStatus, BackendKind, CloudAccount
from backend.clouds.services.accounts import account_config
from backend.core.errors import ApplicationError

DEFAULT_REGION = "us-east-1"


class Stored(Protocol):
    storage_account_id: UUID | None
    storage_bucket: str


def storage_for_new(*, workspace_id: UUID | str) -> Storage:
    """Where ``workspace_id``'s new objects go."""
    account = (
        CloudAccount.objects.filter(
            workspace_id=workspace_id, kind=BackendKind.AWS, status=AccountStatus.ACTIVE, config__bucket__gt=""
        )
        .order_by("created_at")
        .first()
    )
    if account is None:
        return get_storage()
    return _s3(account, str(account.config["bucket"]))


def storage_of(obj: Stored) -> Storage:
    """The storage that holds ``obj`` (a Blob or an Artifact)."""
    if not obj.storage_bucket:
        return get_storage()
    account = CloudAccount.objects.filter(pk=obj.storage_account_id).first() if obj.storage_account_id else None
    if account is None:
        raise ApplicationError(
            f"This object is stored in the S3 bucket {obj.storage_bucket!r} of an AWS connection that was "
            "removed: reconnect that account to read it.",
            status_code=410,
        )
    return _s3(account, obj.storage_bucket)


def location_of(storage: Storage) -> dict[str, object]:
    """The fields that record ``storage`` on a Blob or an Artifact."""
    return {"storage_account_id": storage.account_id, "storage_bucket": storage.bucket}


def _s3(account: CloudAccount, bucket: str) -> S3Storage:
    config = account.config or {}
    regions = config.get("regions") or []
    region = str(config.get("bucket_region") or (regions[0] if regions else DEFAULT_REGION))
    try:
        auth = auth_of(account_config(account))
    except InvalidConfig as e:
        raise ApplicationError(f"The AWS connection {account.name!r} cannot reach its bucket: {e}") from e
    return S3Storage(account_id=account.pk, auth=auth, bucket=bucket, region=region)

"""A workspace's data inputs as listed, and where its S3-compatible data lives.

A ``DataSnapshot`` is one listing of one input (every object's key, size,
ETag and version), named by its digest: the same objects listed twice are one
snapshot. A job names the snapshots it reads in its spec (``spec["data"][i]["snapshot"]``),
so they are part of its cache key.
The entries are stored packed (zlib'ed JSON rows of ``Entry``): a listing
may hold 100,000 objects.
"""

from __future__ import annotations

import json
import zlib
from typing import NamedTuple

from django.db import models

from backend.accounts.models import WorkspaceOwnedModel


class DataEndpoint(WorkspaceOwnedModel):
    """The workspace's S3-compatible endpoint (MinIO, R2, Ceph…), used for
    ``s3://`` inputs when the workspace has no AWS account. The secret is
    stored encrypted (``backend.vault.crypto``) and never returned."""

    endpoint_url = models.CharField(max_length=500)
    region = models.CharField(max_length=64, blank=True)
    access_key_id = models.CharField(max_length=200, blank=True)
    secret_access_key_ciphertext = models.BinaryField(blank=True, default=b"")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace"], name="uniq_dataendpoint_workspace")]

    def __str__(self) -> str:
        return self.endpoint_url


class Entry(NamedTuple):
    """One object of a listing. ``path``: relative to the input's URI ("" for
    an input that names one object); ``etag`` without quotes (an ``https://``
    file's Last-Modified when it has no ETag); ``version_id`` "" where the
    bucket keeps no versions; ``sha256`` the content's digest where known."""

    path: str
    size: int
    etag: str
    version_id: str = ""
    sha256: str = ""


def pack_entries(entries: list[Entry]) -> bytes:
    return zlib.compress(json.dumps([list(e) for e in entries], separators=(",", ":")).encode(), 6)


def unpack_entries(blob: bytes | memoryview) -> list[Entry]:
    return [Entry(*row) for row in json.loads(zlib.decompress(bytes(blob)))]


class DataSnapshot(WorkspaceOwnedModel):
    """One listing of one input, as a run read it. ``digest`` is
    ``DataInput.snapshot``: sha256 over the sorted (path, identity) pairs of
    its files. ``source`` says through what it was read ("aws:<account id>",
    "endpoint:<url>", "anonymous", "https"). ``versioned``: every entry has a
    version id, so a re-run can read exactly these objects again."""

    digest = models.CharField(max_length=64)
    uri = models.CharField(max_length=2048)
    # What every entry's path is appended to for its object's address:
    # "s3://bucket/prefix/" for a prefix, the object's or file's URI for one file.
    root = models.CharField(max_length=2048)
    source = models.CharField(max_length=600)
    file_count = models.PositiveIntegerField()
    total_size = models.PositiveBigIntegerField()
    versioned = models.BooleanField(default=False)
    listed_at = models.DateTimeField()
    entries_packed = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "digest"], name="uniq_datasnapshot_digest")]

    def __str__(self) -> str:
        return f"{self.uri} @ {self.digest[:12]}"

    @property
    def entries(self) -> list[Entry]:
        return unpack_entries(self.entries_packed)

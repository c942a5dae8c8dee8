"""Data inputs: listing them when a run is submitted, storing the listings,
and handing their files to the runner (docs/DATA.md).

A run reads each input as it was when the run was submitted: every object's
key, size, ETag and (where the bucket keeps versions) version id is listed
then and stored as a ``DataSnapshot``; every attempt and every resume reads
that listing. A file's identity (what the machine's cache keys its bytes by)
and the snapshot's digest (part of the job's cache key) are computed here
only; the runner uses them as given.

Listing is bounded: at most ``MAX_OBJECTS`` objects per input, within the
caller's deadline. Every refusal is an ``ApplicationError`` naming the input
and what to do; nothing is stored until every input of a run listed.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.clouds.backends.errors import InvalidConfig
from backend.core.addresses import AddressRefused, PinnedHTTPSConnection, public_address
from backend.core.errors import ApplicationError
from backend.data.models import DataEndpoint, DataSnapshot, Entry, pack_entries
from backend.data.sources import S3Access, s3_access
from backend.runs.models import Job
from backend.vault.crypto import encrypt

MAX_OBJECTS = 100_000
# Files per page of ``GET …/runner/jobs/<job>/data/`` (DataPage).
PAGE_FILES = 1000
# Presigned URLs live this long (the runner asks for a fresh one after a 403).
URL_SECONDS = 3600
HTTPS_TIMEOUT = 10
MAX_REDIRECTS = 5
# A snapshot no job names is deleted once unused this long; at most
# PRUNE_PER_PASS are looked at per query, for at most PRUNE_BUDGET_SECONDS per call.
SNAPSHOT_GRACE = timedelta(days=1)
PRUNE_PER_PASS = 200
PRUNE_BUDGET_SECONDS = 60.0
_USER_AGENT = "trainyard-server (data input listing)"


@dataclass(frozen=True)
class Listing:
    """One input as listed, not stored yet (``snapshot_store``)."""

    uri: str
    root: str
    source: str
    entries: tuple[Entry, ...]
    versioned: bool
    digest: str

    @property
    def file_count(self) -> int:
        return len(self.entries)

    @property
    def total_size(self) -> int:
        return sum(e.size for e in self.entries)


@dataclass(frozen=True)
class Change:
    """What differs between two listings of one input, by path."""

    added: tuple[str, ...]
    changed: tuple[str, ...]
    removed: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def text(self) -> str:
        """``3 objects added, 1 changed, 2 removed`` (zero counts left out)."""
        added = f"{len(self.added)} object{'s' if len(self.added) != 1 else ''} added" if self.added else ""
        changed = f"{len(self.changed)} changed" if self.changed else ""
        removed = f"{len(self.removed)} removed" if self.removed else ""
        return ", ".join(p for p in (added, changed, removed) if p)


def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key or prefix) of ``s3://bucket/key``."""
    rest = uri.removeprefix("s3://")
    bucket, _, key = rest.partition("/")
    return bucket, key


def identity_s3(*, workspace_id: UUID | str, source: str, bucket: str, key: str, entry: Entry) -> str:
    text = f"{workspace_id}|{source}|{bucket}|{key}|{entry.version_id or entry.etag}|{entry.size}"
    return hashlib.sha256(text.encode()).hexdigest()


def identity_https(*, workspace_id: UUID | str, url: str, entry: Entry) -> str:
    text = f"{workspace_id}|https|{url}|{entry.sha256 or entry.etag}|{entry.size}"
    return hashlib.sha256(text.encode()).hexdigest()


def identities(*, workspace_id: UUID | str, root: str, source: str, entries: Sequence[Entry]) -> list[str]:
    """Each entry's ``DataFile.identity``, in order."""
    if root.startswith("https://"):
        return [identity_https(workspace_id=workspace_id, url=root, entry=e) for e in entries]
    bucket, base = split_s3(root)
    return [
        identity_s3(workspace_id=workspace_id, source=source, bucket=bucket, key=base + e.path, entry=e)
        for e in entries
    ]


def digest_of(paths_and_identities: Sequence[tuple[str, str]]) -> str:
    """``DataInput.snapshot``: sha256 over the sorted (path, identity) pairs."""
    h = hashlib.sha256()
    for path, identity in sorted(paths_and_identities):
        h.update(f"{path}\0{identity}\n".encode())
    return h.hexdigest()


def input_list(*, workspace_id: UUID | str, uri: str, sha256: str = "", deadline: float) -> Listing:
    """List one input (``s3://`` through ``s3_access``, ``https://`` by a
    HEAD) before ``deadline`` (``time.monotonic()``)."""
    if uri.startswith("https://"):
        root, source, entries, versioned = uri, "https", [_head_https(uri, sha256)], False
    else:
        bucket, key = split_s3(uri)
        try:
            access = s3_access(workspace_id=workspace_id, bucket=bucket)
        except InvalidConfig as e:
            raise ApplicationError(f"input {uri}: {e}") from None
        root, entries, versioned = _list_s3(access, uri, bucket, key, deadline)
        source = access.source
    ids = identities(workspace_id=workspace_id, root=root, source=source, entries=entries)
    digest = digest_of([(e.path, i) for e, i in zip(entries, ids, strict=True)])
    return Listing(uri=uri, root=root, source=source, entries=tuple(entries), versioned=versioned, digest=digest)


def snapshot_store(*, workspace_id: UUID | str, listing: Listing) -> DataSnapshot:
    """The snapshot of ``listing``: the workspace's stored one with its
    digest, else a new one."""
    found = DataSnapshot.objects.filter(workspace_id=workspace_id, digest=listing.digest).first()
    if found is not None:
        # Used again: ``snapshots_prune`` keeps it at least SNAPSHOT_GRACE longer,
        # past the moment the submission's jobs name it.
        DataSnapshot.objects.filter(pk=found.pk).update(updated_at=timezone.now())
        return found
    try:
        with transaction.atomic():
            return DataSnapshot.objects.create(
                workspace_id=workspace_id,
                digest=listing.digest,
                uri=listing.uri,
                root=listing.root,
                source=listing.source,
                file_count=listing.file_count,
                total_size=listing.total_size,
                versioned=listing.versioned,
                listed_at=timezone.now(),
                entries_packed=pack_entries(list(listing.entries)),
            )
    except IntegrityError:  # stored by a submission at the same moment
        return DataSnapshot.objects.get(workspace_id=workspace_id, digest=listing.digest)


def snapshots_prune(*, budget_seconds: float = PRUNE_BUDGET_SECONDS, per_pass: int = PRUNE_PER_PASS) -> int:
    """Delete snapshots no job of their workspace names (``spec["data"][i]["snapshot"]``)
    and unused for SNAPSHOT_GRACE, oldest first, in passes of ``per_pass``
    until none is left or ``budget_seconds`` have passed (the next call goes
    on); returns how many were deleted. The grace covers a submission that
    stored its listings and has not created its jobs yet."""
    cutoff, deadline, deleted = timezone.now() - SNAPSHOT_GRACE, time.monotonic() + budget_seconds, 0
    last: tuple[Any, Any] | None = None
    while True:
        query = DataSnapshot.objects.filter(updated_at__lt=cutoff)
        if last is not None:
            query = query.filter(models.Q(updated_at__gt=last[0]) | models.Q(updated_at=last[0], pk__gt=last[1]))
        candidates = list(
            query.order_by("updated_at", "pk").values_list("updated_at", "pk", "workspace_id", "digest")[:per_pass]
        )
        for _, pk, workspace_id, digest in candidates:
            named = Job.objects.filter(workspace_id=workspace_id, spec__contains={"data": [{"snapshot": digest}]})
            unused = DataSnapshot.objects.filter(pk=pk, updated_at__lt=cutoff).exclude(models.Exists(named))
            deleted += unused.delete()[0]
        if len(candidates) < per_pass or time.monotonic() > deadline:
            return deleted
        last = candidates[-1][:2]


def listing_of(snapshot: DataSnapshot) -> Listing:
    """A stored snapshot as a listing (a re-run reads the recorded versions)."""
    return Listing(
        uri=snapshot.uri,
        root=snapshot.root,
        source=snapshot.source,
        entries=tuple(snapshot.entries),
        versioned=snapshot.versioned,
        digest=snapshot.digest,
    )


def snapshot_change(old: Sequence[Entry], new: Sequence[Entry]) -> Change:
    """Objects added, changed (another size, ETag or version) and removed."""
    before = {e.path: (e.size, e.etag, e.version_id, e.sha256) for e in old}
    after = {e.path: (e.size, e.etag, e.version_id, e.sha256) for e in new}
    return Change(
        added=tuple(sorted(set(after) - set(before))),
        changed=tuple(sorted(p for p in set(after) & set(before) if after[p] != before[p])),
        removed=tuple(sorted(set(before) - set(after))),
    )


@dataclass(frozen=True)
class PageFile:
    path: str
    size: int
    url: str
    etag: str
    sha256: str
    identity: str


def snapshot_page(*, snapshot: DataSnapshot, after: str, limit: int = PAGE_FILES) -> tuple[list[PageFile], str]:
    """The snapshot's files after path ``after`` (ordered by path), each
    with a URL to GET it, and the ``after`` of the next page ("" at the end)."""
    entries = sorted(snapshot.entries, key=lambda e: e.path)
    start = 0
    if after:
        start = next((i for i, e in enumerate(entries) if e.path > after), len(entries))
    chosen = entries[start : start + limit]
    ids = identities(workspace_id=snapshot.workspace_id, root=snapshot.root, source=snapshot.source, entries=chosen)
    urls = _urls(snapshot, chosen)
    files = [
        PageFile(path=e.path, size=e.size, url=u, etag=e.etag, sha256=e.sha256, identity=i)
        for e, u, i in zip(chosen, urls, ids, strict=True)
    ]
    more = start + limit < len(entries)
    return files, (chosen[-1].path if more and chosen else "")


def snapshot_url(*, snapshot: DataSnapshot, path: str) -> str:
    """A fresh URL for one file of the snapshot; ``ApplicationError`` if it has none at ``path``."""
    entry = next((e for e in snapshot.entries if e.path == path), None)
    if entry is None:
        raise ApplicationError(f"{snapshot.uri} has no file {path!r} in this job's listing", status_code=404)
    return _urls(snapshot, [entry])[0]


# ------------------------------------------------------------------ helpers


def _urls(snapshot: DataSnapshot, entries: Sequence[Entry]) -> list[str]:
    if snapshot.root.startswith("https://"):
        return [snapshot.root for _ in entries]
    bucket, base = split_s3(snapshot.root)
    try:
        access = s3_access(workspace_id=snapshot.workspace_id, bucket=bucket)
    except InvalidConfig as e:
        raise ApplicationError(f"input {snapshot.uri}: {e}") from None
    out = []
    for entry in entries:
        params: dict[str, str] = {"Bucket": bucket, "Key": base + entry.path}
        if entry.version_id:
            params["VersionId"] = entry.version_id
        out.append(access.client.generate_presigned_url("get_object", Params=params, ExpiresIn=URL_SECONDS))
    return out


def _list_s3(access: S3Access, uri: str, bucket: str, key: str, deadline: float) -> tuple[str, list[Entry], bool]:
    """(root, entries, versioned) of ``s3://bucket/key``: one object when
    ``key`` names one, else every object under ``key`` as a prefix."""
    versioned = _versioned(access, bucket)
    found = _objects(access, uri, bucket, key, versioned, deadline)
    if key and not key.endswith("/"):
        exact = [o for o in found if o[0] == key]
        if exact:
            _, size, etag, version = exact[0]
            return f"s3://{bucket}/{key}", [Entry("", size, etag, version)], versioned
        key += "/"
        found = [o for o in found if o[0].startswith(key)]
    entries = [
        Entry(k[len(key) :], size, etag, version)
        for k, size, etag, version in found
        if not (k.endswith("/") and size == 0)  # a console's "folder" marker
    ]
    if not entries:
        raise ApplicationError(
            f"input {uri}: no object is stored under this prefix in bucket {bucket} "
            "(check the key: s3://bucket/prefix/ lists every object under prefix/)"
        )
    return f"s3://{bucket}/{key}", sorted(entries), versioned


def _versioned(access: S3Access, bucket: str) -> bool:
    """Whether the bucket keeps versions; a bucket whose versioning the
    caller may not read is listed as one that keeps none."""
    try:
        answer = access.client.get_bucket_versioning(Bucket=bucket)
    except ClientError as e:
        if _code(e) == "NoSuchBucket":
            raise ApplicationError(f"no bucket {bucket} (check the bucket's name)") from None
        return False
    except BotoCoreError as e:
        raise ApplicationError(f"could not reach S3 for bucket {bucket}: {e}") from None
    return answer.get("Status") == "Enabled"


def _objects(
    access: S3Access, uri: str, bucket: str, prefix: str, versioned: bool, deadline: float
) -> list[tuple[str, int, str, str]]:
    """(key, size, etag, version id) of the latest version of every object under ``prefix``."""
    out: list[tuple[str, int, str, str]] = []
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    try:
        while True:
            if time.monotonic() > deadline:
                raise ApplicationError(
                    f"input {uri}: listing took longer than the submission allows "
                    f"({len(out):,} objects listed so far); name a narrower prefix"
                )
            if versioned:
                page = access.client.list_object_versions(**kwargs)
                for v in page.get("Versions", []):
                    if v.get("IsLatest"):
                        out.append((v["Key"], int(v["Size"]), _etag(v), str(v.get("VersionId") or "")))
            else:
                page = access.client.list_objects_v2(**kwargs)
                for o in page.get("Contents", []):
                    out.append((o["Key"], int(o["Size"]), _etag(o), ""))
            if len(out) > MAX_OBJECTS:
                raise ApplicationError(
                    f"input {uri}: more than {MAX_OBJECTS:,} objects under this prefix; "
                    "name a narrower prefix (or several inputs)"
                )
            if not page.get("IsTruncated"):
                return out
            if versioned:
                kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
                kwargs["VersionIdMarker"] = page.get("NextVersionIdMarker", "")
            else:
                kwargs["ContinuationToken"] = page["NextContinuationToken"]
    except ClientError as e:
        raise ApplicationError(_refusal(access, uri, bucket, e, versioned=versioned)) from None
    except BotoCoreError as e:
        raise ApplicationError(f"input {uri}: could not reach S3: {e}") from None


def _refusal(access: S3Access, uri: str, bucket: str, e: ClientError, *, versioned: bool) -> str:
    code = _code(e)
    if code in ("AccessDenied", "403", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        listing = "s3:ListBucket and s3:ListBucketVersions" if versioned else "s3:ListBucket"
        return (
            f"input {uri}: {access.principal} may not read bucket {bucket} ({code}); its policy must allow "
            f"{listing} on arn:aws:s3:::{bucket} and s3:GetObject (and s3:GetObjectVersion, "
            f"s3:GetBucketVersioning) on arn:aws:s3:::{bucket}/* (docs/DATA.md)"
        )
    if code in ("NoSuchBucket", "404"):
        return f"input {uri}: no bucket {bucket} (check the bucket's name)"
    message = e.response.get("Error", {}).get("Message", "")
    return f"input {uri}: S3 refused the listing ({code}{': ' + message if message else ''})"


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _etag(obj: dict[str, Any]) -> str:
    return str(obj.get("ETag") or "").strip('"')


def _head_https(url: str, pin: str) -> Entry:
    """The file's size and ETag (else Last-Modified) from a HEAD, or from a
    one-byte ranged GET where the server answers no HEAD."""
    status, reason, headers = _ask_https(url, "HEAD", {})
    ranged = False
    size = _size_of(headers, ranged=False) if status == 200 else -1
    if status in (403, 405, 501) or (status == 200 and size < 0):
        status, reason, headers = _ask_https(url, "GET", {"Range": "bytes=0-0"})
        ranged = status == 206
        size = _size_of(headers, ranged=ranged)
    if status not in (200, 206):
        raise ApplicationError(f"input {url}: the server answered {status} {reason}")
    if size < 0:
        raise ApplicationError(f"input {url}: the server does not say the file's size (no Content-Length)")
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    version = (etag or "").strip('"').removeprefix("W/").strip('"') or (modified or "")
    return Entry("", size, version, "", pin)


def _ask_https(url: str, method: str, headers: dict[str, str]) -> tuple[int, str, http.client.HTTPMessage]:
    """(status, reason, headers) of ``method url``, following up to
    ``MAX_REDIRECTS`` redirects; every hop's host is checked by
    ``_public_address`` and connected to at the address checked."""
    at = url
    for _ in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(at)
        if parts.scheme != "https" or not parts.hostname:
            raise ApplicationError(f"input {url}: redirected to {at}, which is not an https:// URL")
        try:
            port = parts.port or 443
        except ValueError:
            raise ApplicationError(f"input {url}: {at} has no valid port") from None
        address = _public_address(url, parts.hostname, port)
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        connection = PinnedHTTPSConnection(parts.hostname, port, address=address, timeout=HTTPS_TIMEOUT)
        try:
            connection.request(method, path, headers={"User-Agent": _USER_AGENT, **headers})
            answer = connection.getresponse()
            answer.read(65536 if method == "GET" else 0)
        except (OSError, http.client.HTTPException) as e:
            raise ApplicationError(f"input {url}: could not reach it ({e})") from None
        finally:
            connection.close()
        location = answer.headers.get("Location")
        if answer.status not in (301, 302, 303, 307, 308) or not location:
            return answer.status, answer.reason, answer.headers
        at = urllib.parse.urljoin(at, location)
    raise ApplicationError(f"input {url}: more than {MAX_REDIRECTS} redirects")


def _public_address(url: str, host: str, port: int) -> str:
    """The address to connect to for ``host`` (``backend.core.addresses``),
    the networks of ``TRAINYARD_DATA_PRIVATE_NETWORKS`` allowed."""
    try:
        return public_address(host, port, allowed=settings.TRAINYARD["DATA_PRIVATE_NETWORKS"])
    except AddressRefused as e:
        hint = (
            "; the server reads only public URLs (an installation whose datasets sit on an internal web server "
            "lists its network in TRAINYARD_DATA_PRIVATE_NETWORKS)"
            if e.not_public
            else ""
        )
        raise ApplicationError(f"input {url}: {e}{hint}") from None


def _size_of(headers: Any, *, ranged: bool) -> int:
    if ranged:
        total = str(headers.get("Content-Range") or "").rpartition("/")[2]
        return int(total) if total.isdigit() else -1
    length = str(headers.get("Content-Length") or "")
    return int(length) if length.isdigit() else -1


# ------------------------------------------------------------------ the workspace's endpoint

_ENDPOINT_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[^\s?#]*)?")
_REGION = re.compile(r"[a-z0-9-]{0,64}")


def data_endpoint_set(
    *, workspace: Workspace, endpoint_url: str, region: str, access_key_id: str, secret_access_key: str
) -> DataEndpoint:
    """Set (or replace) the workspace's S3-compatible endpoint; the secret is
    stored encrypted. No keys: the endpoint's buckets are read anonymously."""
    url = endpoint_url.strip().rstrip("/")
    if not _ENDPOINT_URL.fullmatch(url):
        raise ApplicationError(
            f"endpoint {endpoint_url!r} is not an http(s) URL such as https://minio.example.com:9000",
            extra={"field": "endpoint_url"},
        )
    if not _REGION.fullmatch(region):
        raise ApplicationError(f"region {region!r} is not a region name (e.g. us-east-1)", extra={"field": "region"})
    if bool(access_key_id) != bool(secret_access_key):
        raise ApplicationError(
            "give both the access key id and the secret access key, or neither (anonymous reads)",
            extra={"field": "access_key_id" if secret_access_key else "secret_access_key"},
        )
    values = {
        "endpoint_url": url,
        "region": region,
        "access_key_id": access_key_id,
        "secret_access_key_ciphertext": encrypt(secret_access_key) if secret_access_key else b"",
    }
    endpoint, _ = DataEndpoint.objects.update_or_create(workspace=workspace, defaults=values)
    return endpoint


def data_endpoint_remove(*, workspace: Workspace) -> bool:
    """Forget the workspace's endpoint; False if it had none."""
    deleted, _ = DataEndpoint.objects.filter(workspace=workspace).delete()
    return deleted > 0

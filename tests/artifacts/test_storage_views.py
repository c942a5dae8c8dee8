"""Storage links serve files jobs named and wrote, from the dashboard's own
origin: each answer is a download that no browser renders as a page."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import async_to_sync

from backend.artifacts.models import Artifact
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete, artifact_file_key
from backend.artifacts.storage import get_storage
from backend.runs.models import Run
from tests.support.fixtures import Person

PAGE = b"<html><script>fetch('/api/v1/tokens/', {method: 'POST'})</script></html>"
INERT = {
    "Content-Type": "application/octet-stream",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "sandbox",
}


@pytest.fixture
def artifact(run: Run, settings: Any, tmp_path: Any) -> Artifact:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    files = {"report/x.html": PAGE, "report/plot.svg": b"<svg onload='alert(1)'/>"}
    manifest = [FileIn(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]
    row, _ = artifact_begin(job=run.jobs.get(), path="./out", files=manifest)
    for p, d in files.items():
        get_storage().write(f"{row.storage_prefix}/{p}", iter([d]))
    return artifact_complete(artifact=row)


async def _collect(body: Any) -> bytes:
    """A download's body: an async iterator (it streams under ASGI)."""
    return b"".join([part async for part in body])


def _headers(response: Any) -> dict[str, str]:
    return {name: response.headers.get(name) for name in ("Content-Disposition", *INERT)}


def test_an_html_artifact_downloads_as_an_inert_attachment(artifact: Artifact, viewer: Person) -> None:
    redirect = viewer.client().get(f"/api/v1/workspaces/acme/artifacts/{artifact.pk}/files/report/x.html")
    download = viewer.client().get(urlsplit(redirect["Location"]).path)

    assert redirect.status_code == 302
    assert download.status_code == 200
    assert _headers(download) == {"Content-Disposition": 'attachment; filename="x.html"', **INERT}
    assert async_to_sync(_collect)(download.streaming_content) == PAGE


def test_a_runners_download_link_without_a_filename_is_an_inert_attachment_of_the_keys_name(
    artifact: Artifact, client: Any
) -> None:
    file = artifact.files.get(path="report/plot.svg")
    url = get_storage().signed_url(artifact_file_key(artifact, file), method="GET")  # as in AssignJob.inputs

    download = client.get(urlsplit(url).path)

    assert _headers(download) == {"Content-Disposition": 'attachment; filename="plot.svg"', **INERT}


def test_a_folder_zip_is_an_inert_attachment(artifact: Artifact, viewer: Person) -> None:
    redirect = viewer.client().get(f"/api/v1/workspaces/acme/artifacts/{artifact.pk}/archive/?prefix=report/")
    download = viewer.client().get(urlsplit(redirect["Location"]).path)

    assert _headers(download) == {"Content-Disposition": 'attachment; filename="report.zip"', **INERT}


def test_a_refused_link_is_inert_too(artifact: Artifact, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    file = artifact.files.get(path="report/x.html")
    url = get_storage().signed_url(artifact_file_key(artifact, file), method="GET", seconds=1)
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)  # long after it expired

    expired = client.get(urlsplit(url).path)

    assert expired.status_code == 403
    assert (expired.headers.get("X-Content-Type-Options"), expired.headers.get("Content-Security-Policy")) == (
        "nosniff",
        "sandbox",
    )


def test_a_local_upload_link_takes_only_its_files_bytes_and_never_replaces_a_stored_object(
    settings: Any, tmp_path: Path
) -> None:
    """Issue 11, item 12: the local storage's PUT link is bound to the file's
    SHA-256 (as S3's checksum binds it); other bytes are refused, and once
    the object is stored only the same bytes are taken again."""
    from django.test import Client

    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    storage = get_storage()
    good = b"the trained model"
    target = storage.upload_target(
        "ws/x/model.bin", sha256=hashlib.sha256(good).hexdigest(), size=len(good), seconds=60
    )
    path = target.url.removeprefix(settings.PUBLIC_URL)
    client = Client()

    wrong = client.generic("PUT", path, b"something else", content_type="application/octet-stream")
    assert wrong.status_code == 400 and "not the file this link is for" in wrong.json()["message"]
    assert storage.size("ws/x/model.bin") is None, "nothing written"
    assert client.generic("PUT", path, good, content_type="application/octet-stream").status_code == 201
    assert client.generic("PUT", path, good, content_type="application/octet-stream").status_code == 201, "a retry"
    other = storage.upload_target("ws/x/model.bin", sha256=hashlib.sha256(b"evil").hexdigest(), size=4, seconds=60)
    replaced = client.generic(
        "PUT", other.url.removeprefix(settings.PUBLIC_URL), b"evil", content_type="application/octet-stream"
    )
    assert replaced.status_code == 409
    with storage.open("ws/x/model.bin") as f:
        assert f.read() == good


def test_zip_archives_are_rate_limited_per_user_and_their_links_per_address(
    artifact: Artifact, viewer: Person, member: Person, settings: Any
) -> None:
    """Every archive zips its files again: asking for archives is counted per
    user (429 with Retry-After), and opening archive links per address."""
    limits = {
        **settings.TRAINYARD["RATE_LIMITS"],
        "archive": {"user": (2, 60), "ip": (3, 60)},
    }
    settings.TRAINYARD = {**settings.TRAINYARD, "RATE_LIMITS": limits}
    url = f"/api/v1/workspaces/acme/artifacts/{artifact.pk}/archive/"

    asked = [viewer.client().get(url, REMOTE_ADDR="10.0.0.8") for _ in range(3)]

    assert [r.status_code for r in asked] == [302, 302, 429]
    assert int(asked[2]["Retry-After"]) >= 1
    assert asked[2].json()["message"].startswith("Too many artifact archives from this account: at most 2 per minute.")
    link = urlsplit(asked[0]["Location"]).path
    opened = [member.client().get(link, REMOTE_ADDR="10.0.0.9") for _ in range(4)]
    assert [r.status_code for r in opened] == [200, 200, 200, 429]
    assert int(opened[3]["Retry-After"]) >= 1
    assert opened[3].json()["message"].startswith("Too many artifact archives from this address: at most 3 per minute.")


@pytest.mark.parametrize(
    ("asked", "status", "content_range", "body"),
    [
        ("bytes=10-", 206, f"bytes 10-{len(PAGE) - 1}/{len(PAGE)}", PAGE[10:]),
        ("bytes=0-5", 206, f"bytes 0-5/{len(PAGE)}", PAGE[:6]),
        ("bytes=-4", 206, f"bytes {len(PAGE) - 4}-{len(PAGE) - 1}/{len(PAGE)}", PAGE[-4:]),
        ("bytes=0-3,8-9", 200, None, PAGE),  # several ranges: the whole file
        ("lines=1-2", 200, None, PAGE),
    ],
)
def test_a_download_link_serves_the_byte_range_asked_for(
    artifact: Artifact, viewer: Person, asked: str, status: int, content_range: str | None, body: bytes
) -> None:
    redirect = viewer.client().get(f"/api/v1/workspaces/acme/artifacts/{artifact.pk}/files/report/x.html")
    download = viewer.client().get(urlsplit(redirect["Location"]).path, HTTP_RANGE=asked)

    assert (download.status_code, download.headers.get("Content-Range")) == (status, content_range)
    assert (download["Content-Length"], download["Accept-Ranges"]) == (str(len(body)), "bytes")
    assert async_to_sync(_collect)(download.streaming_content) == body
    assert _headers(download) == {"Content-Disposition": 'attachment; filename="x.html"', **INERT}


def test_a_range_that_starts_past_the_end_is_416_with_the_files_size(artifact: Artifact, viewer: Person) -> None:
    redirect = viewer.client().get(f"/api/v1/workspaces/acme/artifacts/{artifact.pk}/files/report/x.html")
    refused = viewer.client().get(urlsplit(redirect["Location"]).path, HTTP_RANGE=f"bytes={len(PAGE)}-")

    assert (refused.status_code, refused["Content-Range"]) == (416, f"bytes */{len(PAGE)}")
    assert refused.json()["message"] == f"This file has {len(PAGE)} bytes: the range asked for starts past its end."

"""Storage links serve files jobs named and wrote, from the dashboard's own
origin: each answer is a download that no browser renders as a page."""

from __future__ import annotations

import hashlib
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

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


def _headers(response: Any) -> dict[str, str]:
    return {name: response.headers.get(name) for name in ("Content-Disposition", *INERT)}


def test_an_html_artifact_downloads_as_an_inert_attachment(artifact: Artifact, viewer: Person) -> None:
    redirect = viewer.client().get(f"/api/v1/workspaces/acme/artifacts/{artifact.pk}/files/report/x.html")
    download = viewer.client().get(urlsplit(redirect["Location"]).path)

    assert redirect.status_code == 302
    assert download.status_code == 200
    assert _headers(download) == {"Content-Disposition": 'attachment; filename="x.html"', **INERT}
    assert b"".join(download.streaming_content) == PAGE


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

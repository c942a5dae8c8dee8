"""Every endpoint, every kind of caller: who may read, who may write.

A denied request must leave everything as it was.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from rest_framework.test import APIClient

from backend.artifacts.models import Artifact, Blob
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete
from backend.artifacts.storage import get_storage
from backend.runs.models import Run, RunStatus
from backend.vault.models import Secret
from tests.support.fixtures import WORKFLOWS, Person

PAYLOAD = b"weights"


@pytest.fixture
def artifact(run: Run, settings: Any, tmp_path: Any) -> Artifact:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    job = run.jobs.get()
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    row, _ = artifact_begin(job=job, path="./out", files=[FileIn("w.bin", len(PAYLOAD), digest)])
    get_storage().write(f"{row.storage_prefix}/w.bin", iter([PAYLOAD]))
    return artifact_complete(artifact=row)


def _endpoints(run: Run, artifact: Artifact) -> dict[str, tuple[str, str, Any]]:
    base = "/api/v1/workspaces/acme"
    job = run.jobs.get()
    body = {
        "workflow": "hello",
        "workflows_file": {"path": ".trainyard/workflows.yaml", "text": WORKFLOWS},
        "code": {"kind": "git", "repo_url": "https://example.com/r.git", "commit": "b" * 40},
    }
    return {
        "list": ("get", f"{base}/runs/", None),
        "detail": ("get", f"{base}/runs/{run.name}/", None),
        "logs": ("get", f"{base}/jobs/{job.pk}/logs/", None),
        "raw-logs": ("get", f"{base}/jobs/{job.pk}/logs/raw", None),
        "artifacts": ("get", f"{base}/runs/{run.name}/artifacts/", None),
        "file": ("get", f"{base}/artifacts/{artifact.pk}/files/w.bin", None),
        "create": ("post", f"{base}/runs/", body),
        "stop": ("post", f"{base}/runs/{run.name}/stop/", None),
        "blob": ("post", f"{base}/blobs/", b"archive bytes"),
        "tags": ("get", f"{base}/tags/", None),
        "secrets": ("get", f"{base}/secrets/", None),
        "plan": ("post", f"{base}/runs/plan/", body),
        "secret-set": ("put", f"{base}/secrets/TOKEN/", {"value": "s3cret-value"}),
    }


# A dry-run plan is a POST that writes nothing: viewers may ask for one.
READ_OK = {
    "list": 200,
    "detail": 200,
    "logs": 200,
    "raw-logs": 200,
    "artifacts": 200,
    "file": 302,
    "tags": 200,
    "secrets": 200,
    "plan": 200,
}
WRITE_OK = {"create": 201, "stop": 202, "blob": 201, "secret-set": 201}
ADMIN_ONLY = {"secret-set"}  # secrets are written by admins only


def _state(run: Run) -> tuple[int, str, int, int]:
    run.refresh_from_db()
    return Run.objects.count(), run.status, Blob.objects.count(), Secret.objects.count()


def _call(client: APIClient, method: str, url: str, body: Any) -> int:
    if isinstance(body, bytes):
        return client.post(url, body, content_type="application/octet-stream").status_code
    if method == "post":
        return client.post(url, body, format="json").status_code
    if method == "put":
        return client.put(url, body, format="json").status_code
    return client.get(url).status_code


@pytest.mark.parametrize("endpoint", [*READ_OK, *WRITE_OK])
@pytest.mark.parametrize("who", ["anonymous", "outsider", "viewer", "member", "owner"])
def test_access_by_role(who: str, endpoint: str, run: Run, artifact: Artifact, request: pytest.FixtureRequest) -> None:
    client = APIClient() if who == "anonymous" else request.getfixturevalue(who).client()
    method, url, body = _endpoints(run, artifact)[endpoint]
    before = _state(run)

    status = _call(client, method, url, body)

    expected = {**READ_OK, **WRITE_OK}[endpoint]
    if who == "anonymous":
        expected = 401
    elif who == "outsider":
        expected = 404
    elif (who == "viewer" and endpoint in WRITE_OK) or (who == "member" and endpoint in ADMIN_ONLY):
        expected = 403
    assert status == expected
    if status >= 400:
        assert _state(run) == before


def test_outsider_cannot_reach_a_run_through_their_own_workspace(run: Run, outsider: Person) -> None:
    slug = outsider.user.personal_workspace.slug
    client = outsider.client()
    assert client.get(f"/api/v1/workspaces/{slug}/runs/{run.name}/").status_code == 404
    assert client.get(f"/api/v1/workspaces/{slug}/runs/{run.pk}/").status_code == 404
    assert client.get(f"/api/v1/workspaces/{slug}/jobs/{run.jobs.get().pk}/logs/").status_code == 404
    assert client.get(f"/api/v1/workspaces/{slug}/jobs/{run.jobs.get().pk}/logs/raw").status_code == 404
    assert client.post(f"/api/v1/workspaces/{slug}/runs/{run.name}/stop/").status_code == 404
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING


def test_revoked_token_is_refused_with_a_message(owner: Person) -> None:
    owner.user.api_tokens.update(revoked_at="2026-01-01T00:00:00Z")
    response = owner.client().get("/api/v1/me/")
    assert response.status_code == 401
    assert "unknown or revoked" in response.json()["message"]

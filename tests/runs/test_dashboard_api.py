"""Endpoints the dashboard reads: search, re-run, repos, instances, archives,
and the workspace's live run updates."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from backend.accounts.models import Workspace
from backend.artifacts.models import Artifact
from backend.artifacts.services import FileIn, artifact_begin, artifact_complete
from backend.artifacts.storage import get_storage
from backend.clouds.models import Instance, InstanceStatus
from backend.config.asgi import application
from backend.runs.models import Run
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.attempts import accept
from tests.support.fixtures import Person, submit

BASE = "/api/v1/workspaces/acme"


@pytest.fixture
def artifact(run: Run, settings: Any, tmp_path: Any) -> Artifact:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    files = {"model/w.bin": b"\x00\x01weights", "model/cfg.json": b"{}", "README.txt": b"hi"}
    manifest = [FileIn(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]
    row, _ = artifact_begin(job=run.jobs.get(), path="./out", files=manifest)
    for p, d in files.items():
        get_storage().write(f"{row.storage_prefix}/{p}", iter([d]))
    return artifact_complete(artifact=row)


def test_search_matches_name_workflow_and_submitter_and_filters_by_tag(
    team: Workspace, owner: Person, member: Person
) -> None:
    mine = submit(team, owner.user)
    theirs = submit(team, member.user, workflow="big")
    client = owner.client()

    by_user = [r["name"] for r in client.get(f"{BASE}/runs/?q=mate").json()["results"]]
    by_workflow = [r["name"] for r in client.get(f"{BASE}/runs/?q=BIG").json()["results"]]
    by_name = [r["name"] for r in client.get(f"{BASE}/runs/?q={mine.name}").json()["results"]]
    by_tag = client.get(f"{BASE}/runs/?tag=nope").json()["results"]

    assert by_user == by_workflow == [theirs.name]
    assert by_name == [mine.name]
    assert by_tag == []


def test_rerun_submits_the_same_workflow_and_code_again(run: Run, member: Person) -> None:
    response = member.client().post(f"{BASE}/runs/{run.name}/rerun/")
    again = Run.objects.get(pk=response.json()["id"])
    assert response.status_code == 201
    assert (again.workflow, again.commit, again.workflows_file_text) == (
        run.workflow,
        run.commit,
        run.workflows_file_text,
    )
    assert again.name != run.name and again.submitted_by == member.user


def test_repos_list_the_remotes_runs_came_from(run: Run, owner: Person) -> None:
    [repo] = owner.client().get(f"{BASE}/repos/").json()
    assert (repo["name"], repo["url"], repo["runs"]) == ("models", "https://example.com/acme/models.git", 1)


def test_instances_show_state_resources_and_current_job(team: Workspace, run: Run, owner: Person) -> None:
    instance = Instance.objects.create(
        workspace=team,
        backend="local",
        name="local-i",
        token_hash="i" * 64,
        status=InstanceStatus.IDLE,
        cpus=8,
        memory_bytes=2**34,
        channel_name="c",
        hostname="box",
    )
    Instance.objects.create(workspace=team, backend="local", name="gone", token_hash="g" * 64, status="terminated")
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)

    live = owner.client().get(f"{BASE}/instances/").json()
    everything = owner.client().get(f"{BASE}/instances/?all=1").json()

    assert [i["name"] for i in live] == ["local-i"]
    assert live[0]["status"] == "busy" and live[0]["cpus"] == 8
    assert live[0]["current_job"] == {"run": run.name, "job": str(job.pk), "job_name": "hello"}
    assert sorted(i["name"] for i in everything) == ["gone", "local-i"]


def test_a_folder_downloads_as_a_zip_through_a_short_lived_url(artifact: Artifact, viewer: Person) -> None:
    response = viewer.client().get(f"{BASE}/artifacts/{artifact.pk}/archive/?prefix=model/")
    assert response.status_code == 302
    download = viewer.client().get(urlsplit(response["Location"]).path)
    body = async_to_sync(_collect)(download.streaming_content)  # an async body: the zip streams
    names = zipfile.ZipFile(io.BytesIO(body)).namelist()
    assert download["Content-Disposition"] == 'attachment; filename="model.zip"'
    assert names == ["model/cfg.json", "model/w.bin"]
    assert zipfile.ZipFile(io.BytesIO(body)).read("model/w.bin") == b"\x00\x01weights"


@pytest.mark.django_db(transaction=True)
def test_the_workspace_socket_pushes_run_status_changes(team: Workspace, owner: Person, outsider: Person) -> None:
    async def scenario(token: str) -> list[dict[str, Any]]:
        ws = WebsocketCommunicator(
            application, "/ws/v1/workspaces/acme/runs/", headers=[(b"authorization", f"Bearer {token}".encode())]
        )
        await ws.connect()
        first = await ws.receive_output(timeout=5)
        if first["type"] == "websocket.close":
            return [first]
        from channels.db import database_sync_to_async

        run = await database_sync_to_async(submit)(team, owner.user)
        await database_sync_to_async(jobs_schedule)()  # pending → its reason changes: published
        frame = json.loads(await ws.receive_from(timeout=5))
        await ws.disconnect()
        return [json.loads(first["text"]), frame, {"name": run.name}]

    ready, frame, submitted = async_to_sync(scenario)(owner.token)
    [closed] = async_to_sync(scenario)(outsider.token)

    assert ready == {"type": "ready"}
    assert frame["type"] == "run" and frame["run"]["name"] == submitted["name"]
    assert closed == {"type": "websocket.close", "code": 4404}


async def _collect(body: Any) -> bytes:
    return b"".join([part async for part in body])

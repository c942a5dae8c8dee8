"""Two users: B cannot see or touch A's run through any door."""

from __future__ import annotations

import asyncio
from pathlib import Path

import websockets

from tests.e2e.conftest import User, run_name_of


def test_b_gets_404_for_as_run_logs_artifacts_and_websocket(alice: User, bob: User, repo: Path) -> None:
    name = run_name_of(alice.cli(repo, "run", "download-base-model", "-d"))
    run = alice.wait(name, lambda r: r["status"] == "succeeded")
    job = run["jobs"][0]["id"]
    artifact = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/runs/{name}/artifacts/").json()[0]["id"]

    for ws in (alice.workspace, bob.workspace):
        for path in (
            f"/api/v1/workspaces/{ws}/runs/{name}/",
            f"/api/v1/workspaces/{ws}/runs/{run['id']}/",
            f"/api/v1/workspaces/{ws}/jobs/{job}/logs/",
            f"/api/v1/workspaces/{ws}/runs/{name}/artifacts/",
            f"/api/v1/workspaces/{ws}/artifacts/{artifact}/files/weights.json",
        ):
            assert bob.api("GET", path).status_code == 404, path
        assert bob.api("POST", f"/api/v1/workspaces/{ws}/runs/{name}/stop/").status_code == 404
    assert bob.cli(repo, "logs", name).returncode == 1
    assert _ws_close_code(bob, f"/ws/v1/workspaces/{alice.workspace}/runs/{name}/") == 4404
    assert _ws_close_code(bob, f"/ws/v1/workspaces/{bob.workspace}/runs/{name}/") == 4404
    assert alice.run(name)["status"] == "succeeded"


def _ws_close_code(user: User, path: str) -> int:
    async def connect() -> int:
        headers = {"Authorization": f"Bearer {user.token}"}
        async with websockets.connect(user.stack.ws_url + path, additional_headers=headers) as ws:
            try:
                await asyncio.wait_for(ws.recv(), timeout=10)
            except websockets.ConnectionClosed as closed:
                assert closed.rcvd is not None
                return closed.rcvd.code
        raise AssertionError("the server did not close the connection")

    return asyncio.run(connect())


def test_b_gets_404_for_as_backends_offers_and_instances(alice: User, bob: User) -> None:
    for path in ("backends/", "backends/aws/", "backends/aws/setup/", "offers/", "instances/?all=1"):
        assert bob.api("GET", f"/api/v1/workspaces/{alice.workspace}/{path}").status_code == 404, path
    assert bob.api("POST", f"/api/v1/workspaces/{alice.workspace}/backends/aws/validate/").status_code == 404
    assert bob.api("DELETE", f"/api/v1/workspaces/{alice.workspace}/backends/aws/").status_code == 404
    body = {
        "kind": "aws",
        "access_key_id": "AKIAX",
        "secret_access_key": "x",
        "regions": ["us-east-1"],
        "bucket": "b-1",
    }
    assert bob.api("POST", f"/api/v1/workspaces/{alice.workspace}/backends/", json=body).status_code == 404
    own = bob.api("GET", f"/api/v1/workspaces/{bob.workspace}/backends/aws/setup/").json()["external_id"]
    assert own != alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/backends/aws/setup/").json()["external_id"]

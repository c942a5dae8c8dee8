"""A workspace secret: injected into jobs, masked everywhere, private to its workspace."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import websockets

from tests.e2e.conftest import TRAINYARD, User

VALUE = "sk-live-5ecr3t-value-42"
LEAK = """workflows:
  - name: leak
    provider: bash
    commands:
      - echo "key is $WANDB_API_KEY"
      - echo "$WANDB_API_KEY" >&2
"""


def _set(user: User, repo: Path) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "TRAINYARD_URL": user.stack.url, "TRAINYARD_TOKEN": user.token, "HOME": str(repo.parent)}
    return subprocess.run(
        [str(TRAINYARD), "secrets", "set", "WANDB_API_KEY"],
        cwd=repo,
        env=env,
        input=VALUE + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_secret_reaches_the_job_and_is_masked_everywhere(alice: User, bob: User, repo: Path) -> None:
    assert _set(alice, repo).returncode == 0
    (repo / ".trainyard" / "workflows.yaml").write_text(LEAK)

    followed = alice.cli(repo, "run", "leak")
    name = followed.stderr.split("Run ", 1)[1].split()[0]
    job = alice.run(name)["jobs"][0]["id"]
    api_lines = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/jobs/{job}/logs/").json()["lines"]
    logs = alice.cli(repo, "logs", name)
    ws_text = _websocket_text(alice, name)
    listed = alice.cli(repo, "secrets", "ls", "--json")

    assert followed.returncode == 0
    assert [line["text"] for line in api_lines] == ["key is *****", "*****"]
    for text in (followed.stdout + followed.stderr, logs.stdout + logs.stderr, ws_text, listed.stdout):
        assert VALUE not in text
    assert "key is *****" in followed.stdout and "key is *****" in ws_text
    assert [s["name"] for s in json.loads(listed.stdout)] == ["WANDB_API_KEY"]

    bob_listed = bob.api("GET", f"/api/v1/workspaces/{bob.workspace}/secrets/").json()
    bob_run = bob.cli(repo, "run", "leak")
    assert bob_listed == []
    assert bob.api("GET", f"/api/v1/workspaces/{alice.workspace}/secrets/").status_code == 404
    assert bob_run.stdout.splitlines() == ["key is "]  # the variable is empty in bob's workspace
    assert VALUE not in bob_run.stdout and "*****" not in bob_run.stdout  # bob's job never had it
    alice.cli(repo, "secrets", "rm", "WANDB_API_KEY")


def _websocket_text(user: User, run: str) -> str:
    async def collect() -> str:
        headers = {"Authorization": f"Bearer {user.token}"}
        url = f"{user.stack.ws_url}/ws/v1/workspaces/{user.workspace}/runs/{run}/"
        frames = []
        async with websockets.connect(url, additional_headers=headers) as ws:
            while True:
                try:
                    frames.append(await asyncio.wait_for(ws.recv(), timeout=2))
                except TimeoutError:
                    return "\n".join(str(f) for f in frames)

    return asyncio.run(collect())

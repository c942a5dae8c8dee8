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
    secrets: [WANDB_API_KEY]
    commands:
      - echo "key is $WANDB_API_KEY"
      - echo "$WANDB_API_KEY" >&2
"""


def _set(user: User, repo: Path, name: str = "WANDB_API_KEY", value: str = VALUE) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "TRAINYARD_URL": user.stack.url, "TRAINYARD_TOKEN": user.token, "HOME": str(repo.parent)}
    return subprocess.run(
        [str(TRAINYARD), "secrets", "set", name],
        cwd=repo,
        env=env,
        input=value + "\n",
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
    # bob's workspace has no such secret: his run is refused, naming it
    assert bob_run.returncode != 0 and "secret 'WANDB_API_KEY' is not set in this workspace" in bob_run.stderr
    assert VALUE not in bob_run.stdout + bob_run.stderr
    alice.cli(repo, "secrets", "rm", "WANDB_API_KEY")


BACKSLASH = "ab\\cd-21600"  # the value that reached the log in clear (issue 11)
TABBED = "tab\tsecret-42"
PEM = "-----BEGIN TEST KEY-----\nQUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=\n-----END TEST KEY-----"
LONG_LINE = "lt-9f8e7d6c5b4a39281706"  # printed 65,526 bytes into a line: the runner's cut splits it 10 | 13
PRINT = """workflows:
  - name: print
    provider: bash
    secrets: [BACKSLASH, TABBED, PEM, LONG_LINE]
    commands:
      - echo "k=$BACKSLASH"
      - printf 'tab:%s\\n' "$TABBED"
      - printf '%s\\n' "$PEM"
      - head -c 65526 /dev/zero | tr '\\0' x; echo "$LONG_LINE"
      - printf '%s' "$BACKSLASH" | base64
"""


def test_special_characters_lines_of_a_value_the_line_cut_and_base64_are_masked(alice: User, repo: Path) -> None:
    values = {"BACKSLASH": BACKSLASH, "TABBED": TABBED, "PEM": PEM, "LONG_LINE": LONG_LINE}
    try:
        assert [_set(alice, repo, name, value).returncode for name, value in values.items()] == [0, 0, 0, 0]
        (repo / ".trainyard" / "workflows.yaml").write_text(PRINT)

        followed = alice.cli(repo, "run", "print")
        name = followed.stderr.split("Run ", 1)[1].split()[0]
        job = alice.run(name)["jobs"][0]["id"]
        api_lines = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/jobs/{job}/logs/").json()["lines"]
        ws_text = _websocket_text(alice, name)
    finally:
        for secret in values:
            alice.cli(repo, "secrets", "rm", secret)

    assert followed.returncode == 0
    assert [line["text"] for line in api_lines] == [
        "k=*****",
        "tab:*****",
        "*****",
        "*****",
        "*****",
        "x" * 65526 + "*****",
        "*****",
        "*****",
    ]
    pieces = [BACKSLASH, TABBED, *PEM.splitlines(), LONG_LINE[:10], LONG_LINE[10:], "YWJcY2QtMjE2MDA="]
    for text in (followed.stdout + followed.stderr, ws_text):
        assert [piece for piece in pieces if piece in text] == []


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

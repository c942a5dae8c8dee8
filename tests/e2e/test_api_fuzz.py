"""Schemathesis fuzzes the live stack from its own OpenAPI schema: no request answers 5xx.

Its four phases run against the real web server over HTTP (examples,
coverage, fuzzing and the stateful phase, which chains operations through
the links it infers: create a run, re-run it, stop it). It runs as a
workspace's admin, with one run and one secret to work on, and may not
revoke its own token (``tokens_destroy`` is excluded), so it keeps its
access for the whole run. It is bounded: a fixed seed and few examples per operation
(``MAX_EXAMPLES``), with a hard timeout. Checked: no 5xx, and every answer
matches the schema. A failure prints the request
that reproduces it (a curl command) and the stored case (``st replay``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import User
from tests.support.stack import Stack

ST = Path(sys.executable).parent / "st"
MAX_EXAMPLES = 15
SEED = 1
# A hard stop for a stuck run; a normal one takes about two minutes.
TIMEOUT_SECONDS = 300
# A GPU no backend of the test stack offers: its runs (and every re-run the
# fuzzer makes) stay pending and take no runner from the tests after this one.
WORKFLOWS = """\
workflows:
  - name: hello
    provider: bash
    commands: [sleep 5]
    resources:
      gpu: {name: H100, count: 8}
"""
FINISHED = {"succeeded", "failed", "stopped"}
# Its own token: revoking it would leave the rest of the run unauthenticated.
EXCLUDED_OPERATIONS = ("tokens_destroy",)


def _config(workspace: str, run: str) -> str:
    return f"""\
[parameters]
workspace = "{workspace}"
run = "{run}"

[generation]
max-examples = {MAX_EXAMPLES}

[phases.coverage]
# Undocumented methods answer 405 from DRF itself: not worth a request each.
unexpected-methods = []

[phases.stateful]
max-steps = 8
"""


def _seed(fuzzer: User) -> str:
    """One run in the fuzzer's workspace (re-run and stop need one), and a secret."""
    workspace = fuzzer.workspace
    body = {
        "workflow": "hello",
        "workflows_file": {"path": ".trainyard/workflows.yaml", "text": WORKFLOWS},
        "code": {"kind": "git", "repo_url": "https://example.com/fuzz.git", "commit": "f" * 40},
    }
    created = fuzzer.api("POST", f"/api/v1/workspaces/{workspace}/runs/", json=body)
    assert created.status_code == 201, created.text
    secret = fuzzer.api("PUT", f"/api/v1/workspaces/{workspace}/secrets/FUZZ_SECRET/", json={"value": "s3cret-value"})
    assert secret.status_code in (200, 201), secret.text
    return str(created.json()["name"])


def test_the_fuzzer_finds_no_server_error(stack: Stack, tmp_path: Path) -> None:
    fuzzer = User("fuzzer", stack.issue_token("fuzzer"), stack)
    workspace, run = fuzzer.workspace, _seed(fuzzer)
    config = tmp_path / "schemathesis.toml"
    config.write_text(_config(workspace, run))

    try:
        result = _fuzz(stack, fuzzer, config, tmp_path)
    finally:
        # Its hundreds of submissions a minute from 127.0.0.1 use up the
        # address's run window (600/min) that every later test shares.
        stack.rate_limits_reset()
        _stop_all(fuzzer, workspace)

    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    assert fuzzer.api("GET", "/api/v1/me/").status_code == 200
    assert fuzzer.api("GET", f"/api/v1/workspaces/{workspace}/runs/{run}/").status_code == 200


def _fuzz(stack: Stack, fuzzer: User, config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    excluded = [arg for op in EXCLUDED_OPERATIONS for arg in ("--exclude-operation-id", op)]
    return subprocess.run(
        [
            str(ST), "--config-file", str(config), "--no-color", "run", f"{stack.url}/api/v1/schema/",
            "--header", f"Authorization: Bearer {fuzzer.token}",
            "--phases", "examples,coverage,fuzzing,stateful",
            "--checks", "not_a_server_error,response_schema_conformance",
            "--seed", str(SEED),
            "--workers", "1", "--request-timeout", "30",
            *excluded,
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
    )  # fmt: skip


def _stop_all(fuzzer: User, workspace: str) -> None:
    """The runs the fuzzer made wait for nothing once it is done."""
    runs = fuzzer.api("GET", f"/api/v1/workspaces/{workspace}/runs/?page_size=500").json()["results"]
    for run in runs:
        if run["status"] not in FINISHED:
            fuzzer.api("POST", f"/api/v1/workspaces/{workspace}/runs/{run['name']}/stop/")

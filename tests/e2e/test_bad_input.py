"""A bad workflow file gets its precise message (file, line, key) from the
CLI before anything is sent, and from the API too; no run is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import User

F = ".trainyard/workflows.yaml"
HEAD = "workflows:\n  - name: a\n    provider: bash\n"
CASES = {
    "yaml syntax": ("workflows:\n  - name: a\n    commands: [echo\n", f"{F}:4: yaml: invalid YAML"),
    "not a list": ("workflows: hello\n", f"{F}:1: workflows: expected a list of workflows"),
    "unknown key": (
        HEAD + "    comands: [echo hi]\n",
        f"{F}:4: workflows[0] (a).comands: unknown key 'comands'; did you mean 'commands'?",
    ),
    "missing commands": (HEAD, f"{F}:3: workflows[0] (a).provider: the bash provider needs 'commands'"),
    "memory: lots": (
        HEAD + "    commands: [echo]\n    resources:\n      memory: lots\n",
        f"{F}:6: workflows[0] (a).resources.memory: expected a size such as 512MB or 16GB, got 'lots'",
    ),
    "item not a string": (
        HEAD + "    commands:\n      - echo hi\n      - {x: 1}\n",
        f"{F}:6: workflows[0] (a).commands[1]: expected a string, got a mapping",
    ),
    "unknown provider": (
        "workflows:\n  - name: a\n    provider: conda\n    commands: [echo]\n",
        f"{F}:3: workflows[0] (a).provider: unknown provider 'conda'",
    ),
    "duplicate name": (
        HEAD + "    commands: [echo]\n" + HEAD.removeprefix("workflows:\n") + "    commands: [echo]\n",
        f"{F}:5: workflows[1] (a).name: duplicate workflow name 'a' (first at line 2)",
    ),
    "gpu count 0": (
        HEAD + "    commands: [echo]\n    resources:\n      gpu: {name: V100, count: 0}\n",
        f"{F}:6: workflows[0] (a).resources.gpu.count: a gpu count must be at least 1",
    ),
    "missing name": (
        "workflows:\n  - provider: bash\n    commands: [echo]\n",
        f"{F}:2: workflows[0].name: missing required key 'name'",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_cli_refuses_a_bad_file_with_its_message_and_submits_nothing(alice: User, repo: Path, case: str) -> None:
    text, message = CASES[case]
    (repo / F).write_text(text)
    before = len(alice.runs())

    result = alice.cli(repo, "run", "a")

    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(alice.runs()) == before


@pytest.mark.parametrize("case", list(CASES))
def test_the_api_refuses_a_bad_file_too(alice: User, case: str) -> None:
    text, message = CASES[case]
    before = len(alice.runs())
    body = {
        "workflow": "a",
        "workflows_file": {"path": F, "text": text},
        "code": {"kind": "git", "repo_url": "https://example.com/r.git", "commit": "c" * 40},
    }

    response = alice.api("POST", f"/api/v1/workspaces/{alice.workspace}/runs/", json=body)

    assert response.status_code == 400
    assert message in response.json()["message"]
    first = response.json()["extra"]["errors"][0]
    assert first["file"] == F and f"{F}:{first['line']}:" in message
    assert len(alice.runs()) == before


def test_an_unknown_workflow_names_the_ones_there_are(alice: User, repo: Path) -> None:
    result = alice.cli(repo, "run", "helo")
    assert result.returncode == 1
    assert "helo" in result.stderr and "hello" in result.stderr


def test_a_bad_placement_value_is_refused_with_its_line_and_a_good_one_runs(alice: User, repo: Path) -> None:
    path = repo / ".trainyard" / "workflows.yaml"
    text = path.read_text()
    line = text.count("\n") + 4
    path.write_text(text + "  - name: flaky\n    provider: bash\n    commands: [exit 1]\n    max_duration: soon\n")
    refused = alice.cli(repo, "run", "flaky")
    assert refused.returncode == 1
    assert f".trainyard/workflows.yaml:{line}: " in refused.stderr
    assert ".max_duration: expected a duration such as 30m, 2h or 1d (or off), got 'soon'" in refused.stderr
    assert "Traceback" not in refused.stderr
    path.write_text(text + "  - name: flaky\n    provider: bash\n    commands: [exit 1]\n    max_duration: 2h\n")
    assert alice.cli(repo, "run", "hello", "--backend", "local").returncode == 0

"""`trainyard run` and `trainyard workflows` in a dstack 0.x-style repo:
workflows split over .dstack/workflows/*.yaml, a variables file, env lists
with bare names, `-- args`, a dev environment and one broken workflow."""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
from pathlib import Path

import httpx
import pytest
from trainyard.commands.common import workflow_sources
from trainyard_spec import load_workflows, resolve_run_plan

from tests.cli.test_commands import WS, FakeRest, invoke, submit_routes, use

DATA = """\
workflows:
  - name: prepare
    help: Downloads the dataset
    provider: bash
    commands: [python prepare.py]
    artifacts: [./data]
"""
TRAIN = """\
workflows:
  - name: train
    help: Fine-tunes the model
    provider: bash
    python: 3.10
    deps:
      - workflow: prepare
      - :base-model
    env:
      - HF_TOKEN
      - EPOCHS=3
    commands:
      - python train.py ${{ run.args }} --lr ${{ variables.lr }}
    resources:
      interruptible: true
      gpu: {name: A10G, count: 1}
      memory: 16GB
  - name: ide
    provider: code
    setup: [pip install -r requirements.txt]
    version: 1.67.2
  - name: broken
    provider: bash
    comands: [echo broken]
"""
VARIABLES = """\
variables:
  train:
    lr: 0.001
"""
BROKEN_WARNING = (
    "warning: workflow 'broken' cannot be run:\n"
    "  .dstack/workflows/train.yaml:24: workflows[2] (broken).comands: unknown key 'comands'; did you mean 'commands'?\n"
)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "repo"
    (root / ".dstack" / "workflows").mkdir(parents=True)
    (root / ".dstack" / "workflows" / "train.yaml").write_text(TRAIN)
    (root / ".dstack" / "workflows" / "data.yaml").write_text(DATA)
    (root / ".dstack" / "variables.yaml").write_text(VARIABLES)
    (root / "train.py").write_text("print('train')\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_shell")
    monkeypatch.setenv("UNRELATED_SECRET", "never-sent")
    return root


def test_run_sends_every_file_the_bare_env_values_the_args_and_the_variables(
    repo: Path, monkeypatch: pytest.MonkeyPatch
):
    rest = FakeRest(submit_routes())
    use(monkeypatch, "http://fake", rest)
    code, out, err = invoke("run", "train", "-d", "-e", "lr=0.01", "--", "--epochs", "3", "--name", "it's")
    assert (code, out) == (0, "brave-otter-1\n")
    sent = "Sending from this shell and -e: HF_TOKEN, lr (kept encrypted, masked in logs)\n"
    assert (
        err
        == BROKEN_WARNING
        + sent
        + "Run brave-otter-1 submitted (2 jobs: prepare, train)\nView: http://fake/w/ws1/runs/brave-otter-1\n"
    )
    body = json.loads(rest.requests[1].content)
    assert body["workflows_files"] == [
        {"path": ".dstack/workflows/data.yaml", "text": DATA},
        {"path": ".dstack/workflows/train.yaml", "text": TRAIN},
    ]
    assert (body["env"], body["inherited_env"], body["run_args"], body["variables"]) == (
        {"lr": "0.01"},
        {"HF_TOKEN": "hf_from_the_shell"},
        ["--epochs", "3", "--name", "it's"],
        {"train": {"lr": "0.001"}},
    )
    assert "workflows_file" not in body


def test_a_bare_env_name_unset_in_the_shell_is_refused_before_anything_is_sent(
    repo: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("HF_TOKEN")
    rest = FakeRest({})
    use(monkeypatch, "http://fake", rest)
    code, _, err = invoke("run", "train")
    assert (code, rest.requests) == (1, [])
    assert err == (
        ".dstack/workflows/train.yaml:10: workflows[0] (train).env[0]: 'HF_TOKEN' takes its value from the shell "
        "that runs trainyard, where it is not set\n"
    )


def test_an_undefined_variable_is_refused_naming_it(repo: Path, monkeypatch: pytest.MonkeyPatch):
    (repo / ".dstack" / "variables.yaml").unlink()
    use(monkeypatch, "http://fake", FakeRest({}))
    code, _, err = invoke("run", "train")
    assert (code, err) == (
        1,
        ".dstack/workflows/train.yaml:13: workflows[0] (train).commands[0]: undefined variable 'lr': define it in "
        ".trainyard/variables.yaml or pass -e lr=VALUE\n",
    )


def test_running_the_broken_workflow_prints_its_errors(repo: Path, monkeypatch: pytest.MonkeyPatch):
    use(monkeypatch, "http://fake", FakeRest({}))
    code, _, err = invoke("run", "broken")
    assert (code, err) == (
        1,
        ".dstack/workflows/train.yaml:24: workflows[2] (broken).comands: unknown key 'comands'; "
        "did you mean 'commands'?\n",
    )


def test_running_a_dev_environment_with_a_version_says_that_key_is_not_supported(
    repo: Path, monkeypatch: pytest.MonkeyPatch
):
    use(monkeypatch, "http://fake", FakeRest({}))
    code, _, err = invoke("run", "ide")
    assert (code, err) == (
        1,
        ".dstack/workflows/train.yaml:21: workflows[1] (ide).version: not supported yet: version: 1.67.2 (VS Code "
        "is the one on your machine, over Remote-SSH); remove it to run the workflow\n",
    )


def test_dry_run_shows_the_workflows_help(repo: Path, monkeypatch: pytest.MonkeyPatch):
    plan = {"workflow": "prepare", "help": "Downloads the dataset", "jobs": []}
    use(monkeypatch, "http://fake", FakeRest({("POST", f"{WS}/runs/plan/"): httpx.Response(200, json=plan)}))
    code, out, _ = invoke("run", "prepare", "--dry-run")
    assert (code, out) == (0, "Plan for prepare: 0 jobs\n  Downloads the dataset\n")


def test_workflows_lists_name_provider_resources_and_help(repo: Path):
    code, out, err = invoke("workflows")
    assert (code, err) == (0, BROKEN_WARNING)
    assert [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()] == [
        ["NAME", "PROVIDER", "RESOURCES", "HELP"],
        ["prepare", "bash", "any", "Downloads the dataset"],
        ["train", "bash", "memory 16.0 GiB, gpu 1x A10G", "Fine-tunes the model"],
        ["ide", "code", "any"],
    ]


def test_workflows_json_agrees_with_the_plan(repo: Path):
    code, out, _ = invoke("workflows", "--json")
    entries = {e["name"]: e for e in json.loads(out)}
    assert code == 0
    assert list(entries) == ["prepare", "train", "ide", "broken"]
    plan = resolve_run_plan(
        load_workflows(workflow_sources(repo)),
        "train",
        env_overrides={},
        inherited_env={"HF_TOKEN": "x"},
        variables={"train": {"lr": "1"}},
    )
    for job in plan.jobs:
        assert entries[job.name]["resources"] == dataclasses.asdict(job.resources)
    assert entries["train"] | {"resources": None} == {
        "name": "train",
        "file": ".dstack/workflows/train.yaml",
        "line": 2,
        "provider": "bash",
        "help": "Fine-tunes the model",
        "resources": None,
        "placement": {"spot_policy": "spot"},
        "errors": [],
    }
    assert entries["broken"]["errors"] == [BROKEN_WARNING.splitlines()[1].strip()]


def test_workflows_in_a_repo_without_any(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("workflows")
    assert code == 1
    assert err == textwrap.dedent(f"""\
        {tmp_path}: workflows: no workflows file: `trainyard init` writes a starter, or create .trainyard/workflows.yaml (or .dstack/workflows.yaml) with a 'workflows:' list
        """)


def test_only_the_bare_env_names_of_the_runs_workflows_leave_the_machine(repo: Path, monkeypatch: pytest.MonkeyPatch):
    rest = FakeRest(submit_routes())
    use(monkeypatch, "http://fake", rest)
    code, out, _ = invoke("run", "prepare", "-d")
    body = json.loads(rest.requests[1].content)
    assert (code, out) == (0, "brave-otter-1\n")
    assert [k for k in ("inherited_env", "run_args", "variables") if k in body] == []

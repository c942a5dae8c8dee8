"""A dstack 0.x-style repo runs as it is, end to end: workflows split over
.dstack/workflows/*.yaml (one depending on another's artifacts), an env list
with a bare name from the submitting shell, ``-- args`` and a variables file,
next to a dev environment and a broken workflow that are not run."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import User, commit_all

DATA = """\
workflows:
  - name: dstack-prepare
    help: Writes the dataset
    provider: bash
    commands:
      - mkdir -p data && echo rows=42 > data/rows.txt
    artifacts:
      - path: ./data
"""
TRAIN = """\
workflows:
  - name: dstack-train
    help: Reads the dataset
    provider: bash
    python: 3.10
    deps:
      - workflow: dstack-prepare
    env:
      - DSTACK_E2E_SETTING
      - EPOCHS=3
    commands:
      - echo "$(cat data/rows.txt) setting=$DSTACK_E2E_SETTING epochs=$EPOCHS"
      - printf 'arg=%s\\n' ${{ run.args }}
      - echo "lr=${{ variables.lr }}"
  - name: dstack-ide
    provider: code
    setup: [pip install jupyter]
  - name: dstack-broken
    provider: bash
    comands: [echo never]
"""


def test_a_dstack_repo_runs_as_it_is(alice: User, repo: Path) -> None:
    folder = repo / ".dstack" / "workflows"
    folder.mkdir(parents=True)
    (folder / "data.yaml").write_text(DATA)
    (folder / "train.yaml").write_text(TRAIN.replace("    python: 3.10\n", ""))
    (repo / ".dstack" / "variables.yaml").write_text("variables:\n  dstack-train:\n    lr: 0.001\n")
    commit_all(repo, "dstack workflows")

    result = alice.cli(
        repo,
        "run",
        "dstack-train",
        "--",
        "--name",
        "it's a test",
        env={"DSTACK_E2E_SETTING": "from-my-shell"},
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "[dstack-train] rows=42 setting=from-my-shell epochs=3\n"
        "[dstack-train] arg=--name\n"
        "[dstack-train] arg=it's a test\n"
        "[dstack-train] lr=0.001\n"
    )
    assert "warning: workflow 'dstack-broken' cannot be run:" in result.stderr


def test_without_the_shell_value_nothing_is_submitted(alice: User, repo: Path) -> None:
    folder = repo / ".dstack" / "workflows"
    folder.mkdir(parents=True)
    (folder / "data.yaml").write_text(DATA)
    (folder / "train.yaml").write_text(TRAIN)
    commit_all(repo, "dstack workflows")
    before = len(alice.runs())

    result = alice.cli(repo, "run", "dstack-train", "-e", "lr=1")

    assert (result.returncode, len(alice.runs())) == (1, before)
    assert result.stderr == (
        ".dstack/workflows/train.yaml:9: workflows[0] (dstack-train).env[0]: 'DSTACK_E2E_SETTING' takes its "
        "value from the shell that runs trainyard, where it is not set\n"
    )

"""``trainyard init`` in a new, empty git repo (no commit, no remote), as a
user starts: it writes .trainyard/workflows.yaml and train.py, and both of
its workflows run on the stack as written; a second ``init`` replaces
nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.conftest import User, git
from tests.support.stack import Stack


@pytest.fixture(scope="module")
def lior(stack: Stack) -> User:
    return User("lior", stack.issue_token("lior"), stack)


def _empty_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "my-project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    return repo


def test_init_then_run_hello_and_train_in_an_empty_git_repo(lior: User, tmp_path: Path) -> None:
    repo = _empty_repo(tmp_path)

    init = lior.cli(repo, "init")
    assert init.returncode == 0, init.stderr
    assert (repo / ".trainyard" / "workflows.yaml").is_file() and (repo / "train.py").is_file()
    assert "Wrote .trainyard/workflows.yaml and train.py" in init.stdout
    assert "trainyard run hello" in init.stdout

    listed = lior.cli(repo, "workflows")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["hello", "train"]

    hello = lior.cli(repo, "run", "hello")
    assert hello.returncode == 0, hello.stderr
    assert re.fullmatch(r"hello from \S+, python 3\.\d+\.\d+\n", hello.stdout), hello.stdout

    train = lior.cli(repo, "run", "train")
    assert train.returncode == 0, train.stderr
    assert "epoch  20/20  loss" in train.stdout and "done: a=" in train.stdout
    [run] = [r for r in lior.runs() if r["workflow"] == "train"]
    artifacts = lior.cli(repo, "artifacts", "list", run["name"])
    assert artifacts.returncode == 0 and "./model" in artifacts.stdout, artifacts.stdout + artifacts.stderr
    metrics = lior.cli(repo, "metrics", run["name"])
    assert re.search(r"^train +loss +\S+ +step +20\b", metrics.stdout, re.MULTILINE), metrics.stdout


def test_init_replaces_nothing(lior: User, tmp_path: Path) -> None:
    repo = _empty_repo(tmp_path)
    (repo / "train.py").write_text("print('my own')\n")

    first = lior.cli(repo, "init")
    assert first.returncode == 0, first.stderr
    assert (repo / "train.py").read_text() == "print('my own')\n"
    assert "Kept your train.py" in first.stderr and "Wrote .trainyard/workflows.yaml in" in first.stdout

    (repo / ".trainyard" / "workflows.yaml").write_text("workflows: []\n")
    again = lior.cli(repo, "init")
    assert again.returncode == 1
    assert again.stderr == (
        "error: .trainyard/workflows.yaml already exists: trainyard init writes a new project's first workflows "
        "file and never replaces one; add workflows to it, or see them with `trainyard workflows`\n"
    )
    assert (repo / ".trainyard" / "workflows.yaml").read_text() == "workflows: []\n"


def test_init_refuses_beside_a_dstack_file_too(lior: User, tmp_path: Path) -> None:
    repo = _empty_repo(tmp_path)
    (repo / ".dstack" / "workflows").mkdir(parents=True)
    (repo / ".dstack" / "workflows" / "train.yaml").write_text("workflows: []\n")

    result = lior.cli(repo / ".dstack", "init")  # from a folder inside the repo: the top level is checked

    assert result.returncode == 1
    assert result.stderr.startswith("error: .dstack/workflows/train.yaml already exists"), result.stderr
    assert not (repo / ".trainyard").exists() and not (repo / "train.py").exists()

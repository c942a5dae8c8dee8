"""A dstack 0.x ``bash`` workflow that carries ``requirements:`` (dstack's
bash provider ignored the key; real example repositories have it) is listed
and runs, with a warning that names the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import User, commit_all, git
from tests.support.stack import Stack

WORKFLOWS = """\
workflows:
  - name: prepare
    help: Prints the requirements it was given
    provider: bash
    requirements: requirements.txt
    commands:
      - 'echo "requirements: $(cat requirements.txt)"'
"""
WARNING = (
    "warning: .dstack/workflows/prepare.yaml:5: workflows[0] (prepare).requirements: ignored: the bash provider "
    "does not use 'requirements' (dstack 0.x ignored it too); to install them, write environment: "
    "{requirements: FILE} (or pip install -r FILE in commands)\n"
)


@pytest.fixture(scope="module")
def omar(stack: Stack) -> User:
    return User("omar", stack.issue_token("omar"), stack)


def test_a_bash_workflow_with_requirements_lists_and_runs_with_the_warning(omar: User, tmp_path: Path) -> None:
    repo = tmp_path / "dstack-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / ".dstack" / "workflows").mkdir(parents=True)
    (repo / ".dstack" / "workflows" / "prepare.yaml").write_text(WORKFLOWS)
    (repo / "requirements.txt").write_text("tinypkg-that-is-never-installed==7.0\n")
    commit_all(repo, "a dstack 0.x workflow")

    listed = omar.cli(repo, "workflows")
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == WARNING
    assert [line.split()[:2] for line in listed.stdout.splitlines()[1:]] == [["prepare", "bash"]]

    ran = omar.cli(repo, "run", "prepare")
    assert ran.returncode == 0, ran.stderr
    assert WARNING in ran.stderr
    # Nothing was built from the file (the package does not exist): the commands ran as written.
    assert ran.stdout == "requirements: tinypkg-that-is-never-installed==7.0\n", ran.stdout
    assert "[trainyard] environment" not in ran.stderr + ran.stdout

"""The job runs exactly the user's working tree: commit + uncommitted patch,
or an uploaded archive when there is no remote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import User, commit_all, make_repo

PROBE = """workflows:
  - name: probe
    provider: bash
    commands:
      - cat message.txt
      - cat notes/new.txt
      - test ! -e secret.log && echo "ignored file absent"
"""


def _prepare(repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(PROBE)
    (repo / "message.txt").write_text("committed\n")
    (repo / ".gitignore").write_text("*.log\n")
    commit_all(repo, "probe")
    (repo / "message.txt").write_text("uncommitted edit\n")  # tracked, modified
    (repo / "notes").mkdir()
    (repo / "notes" / "new.txt").write_text("untracked file\n")  # untracked, not ignored
    (repo / "secret.log").write_text("ignored\n")  # ignored: must not ship


EXPECTED = ["uncommitted edit", "untracked file", "ignored file absent"]


def test_uncommitted_changes_are_what_the_job_runs(alice: User, repo: Path) -> None:
    _prepare(repo)
    status_before = (repo / ".git" / "index").read_bytes()

    result = alice.cli(repo, "run", "probe")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED
    assert (repo / ".git" / "index").read_bytes() == status_before  # the user's index is untouched
    run = alice.runs()[0]
    assert run["code"]["kind"] == "git" and run["code"]["has_patch"] is True


@pytest.mark.parametrize("how", ["no-remote", "--upload"])
def test_the_archive_path_ships_the_same_tree(alice: User, tmp_path: Path, how: str) -> None:
    repo = make_repo(tmp_path / "tiny-train", remote=how == "--upload")
    _prepare(repo)

    result = alice.cli(repo, "run", "probe", *(["--upload"] if how == "--upload" else []))

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == EXPECTED
    assert alice.runs()[0]["code"]["kind"] == "archive"


def test_the_commit_recorded_is_head(alice: User, repo: Path) -> None:
    head = (repo / ".git" / "refs" / "heads" / "main").read_text().strip()
    result = alice.cli(repo, "run", "hello", "-d")
    name = result.stdout.strip().splitlines()[-1]
    run = alice.run(name)
    assert run["code"]["commit"] == head
    assert json.dumps(run["code"]).count("origin") == 1  # the remote URL is recorded

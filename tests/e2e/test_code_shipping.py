"""The job runs exactly the user's working tree: commit + uncommitted patch,
or an uploaded archive when there is no remote; .trainyardignore leaves files
out of both, and what the CLI downloads into the repo changes neither."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import User, commit_all, make_repo, run_name_of

PROBE = """workflows:
  - name: probe
    provider: bash
    commands:
      - cat message.txt
      - cat notes/new.txt
      - test ! -e secret.log && echo "ignored file absent"
      - test ! -e scratch && echo "trainyardignored folder absent"
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
    (repo / ".trainyardignore").write_text("# local only\nscratch/\n")
    (repo / "scratch").mkdir()
    (repo / "scratch" / "big.bin").write_bytes(b"\0" * 4096)  # in .trainyardignore: must not ship


EXPECTED = ["uncommitted edit", "untracked file", "ignored file absent", "trainyardignored folder absent"]


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


@pytest.mark.parametrize("how", ["patch", "--upload"])
def test_a_download_into_the_repo_does_not_change_the_next_runs_code(
    alice: User, repo: Path, tmp_path: Path, how: str
) -> None:
    (repo / "unique.txt").write_text(f"{tmp_path}\n")  # this test's own cache key
    upload = ["--upload"] if how == "--upload" else []
    first = run_name_of(alice.cli(repo, "run", "download-base-model", "-d", *upload))
    job = alice.wait(first, lambda r: r["status"] in {"succeeded", "failed"})["jobs"][0]
    assert job["status"] == "succeeded", job

    downloaded = alice.cli(repo, "artifacts", "download", first, "-o", "out/")
    again = alice.cli(repo, "artifacts", "download", first, "-o", "out/")

    assert downloaded.returncode == 0, downloaded.stderr
    assert (repo / "out" / "base_model").is_dir()
    assert "Added /out/ to .git/info/exclude: downloads do not change your runs' code" in downloaded.stderr
    assert "Added" not in again.stderr  # once is enough
    second = run_name_of(alice.cli(repo, "run", "download-base-model", "-d", *upload))
    reused = alice.wait(second, lambda r: r["status"] in {"succeeded", "failed"})["jobs"][0]
    assert reused["cached_from"] == {"run": first, "job": job["id"]}

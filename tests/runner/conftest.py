"""Runner tests: plain pytest, no Django (the runner package has no Django)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


def run_git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def git() -> Callable[..., str]:
    """``git(cwd, *args)`` → stdout; raises on failure."""
    return run_git


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repository with one commit; returns (path, commit)."""
    path = tmp_path / "repo"
    path.mkdir()
    run_git(path, "init", "-q", "-b", "main")
    run_git(path, "config", "user.email", "t@example.com")
    run_git(path, "config", "user.name", "t")
    (path / "train.py").write_text("print('v1')\n")
    run_git(path, "add", "-A")
    run_git(path, "commit", "-qm", "init")
    return path, run_git(path, "rev-parse", "HEAD")

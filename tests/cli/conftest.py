"""Tests of the trainyard CLI package. No Django and no server here: run with
``python -m pytest tests/cli -p no:django``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

TINY_TRAIN = Path(__file__).resolve().parents[3] / "shared" / "examples" / "tiny-train"


@pytest.fixture
def tiny_train(tmp_path: Path) -> Path:
    """A writable copy of the tiny-train example repo (not a git repo)."""
    if not TINY_TRAIN.is_dir():
        pytest.fail(f"the example repo is missing: {TINY_TRAIN} (shared/ must sit beside the repo)")
    dest = tmp_path / "tiny-train"
    shutil.copytree(TINY_TRAIN, dest)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return dest


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the developer's real config or token."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_WORKSPACE", "TRAINYARD_PROFILE"):
        monkeypatch.delenv(name, raising=False)

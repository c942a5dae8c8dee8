"""Tests of the trainyard-spec package (the workflow schema and the provider
SDK). No Django, no server and no CLI here: run with
``python -m pytest tests/spec -p no:django``."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_TRAIN = Path(__file__).resolve().parents[3] / "shared" / "examples" / "tiny-train"


@pytest.fixture
def tiny_train() -> Path:
    """The tiny-train example repo (read only: these tests only load its workflows file)."""
    if not TINY_TRAIN.is_dir():
        pytest.fail(f"the example repo is missing: {TINY_TRAIN} (shared/ must sit beside the repo)")
    return TINY_TRAIN

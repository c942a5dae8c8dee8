"""The checks STYLE.md asks of every change, run with the suite so CI enforces them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["backend", "cli", "runner", "spec", "tests", "bench"]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args, *SOURCES], cwd=ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing() -> None:
    result = _ruff("check", "--output-format", "concise")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_code_is_ruff_formatted() -> None:
    result = _ruff("format", "--check")
    assert result.returncode == 0, "run `ruff format`:\n" + result.stdout + result.stderr


@pytest.mark.django_db
def test_every_model_change_has_its_migration() -> None:
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)

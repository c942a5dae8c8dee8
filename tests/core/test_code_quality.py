"""The checks every change must pass (ruff, the import contracts, mypy, migrations), run with the suite so CI enforces them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["backend", "cli", "runner", "spec", "tests", "bench"]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args, *SOURCES], cwd=ROOT, capture_output=True, text=True)


def _lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([command, "--no-logo", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing() -> None:
    result = _ruff("check", "--output-format", "concise")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_code_is_ruff_formatted() -> None:
    result = _ruff("format", "--check")
    assert result.returncode == 0, "run `ruff format`:\n" + result.stdout + result.stderr


def test_the_import_contracts_hold() -> None:
    """The boundaries of docs/ARCHITECTURE.md, as contracts in .importlinter (docs/ARCHITECTURE-CHECKS.md)."""
    result = _lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_import_contract_fails_the_check(tmp_path: Path) -> None:
    """The check is not vacuous: the same graph with a contract the code breaks
    (backend.runs.models builds on backend.accounts.models) fails."""
    config = tmp_path / "importlinter.ini"
    config.write_text(
        (ROOT / ".importlinter").read_text()
        + "\n[importlinter:contract:broken-on-purpose]\nname = broken on purpose\ntype = forbidden\n"
        + "source_modules = backend.runs.models\nforbidden_modules = backend.accounts.models\n"
    )
    result = _lint_imports("--config", str(config), "--no-cache")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "broken on purpose BROKEN" in result.stdout
    assert re.search(r"^Contracts: \d+ kept, 1 broken\.$", result.stdout, re.MULTILINE), result.stdout


def test_mypy_finds_nothing() -> None:
    """mypy.ini: every function annotated; strict for the runner, the spec package, backend.clouds and the runs services."""
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.django_db
def test_every_model_change_has_its_migration() -> None:
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)

"""The contracts that keep ``backend.runs`` in layers, its service packages
free of cycles, tasks reached only by name and ``backend.artifacts`` below
runs (.importlinter) each report a deliberately wrong import: a copy of
``backend`` with one more module is checked against the repository's own
configuration."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CASES = {
    "the layers": (
        {"backend/runs/lifecycle/wrong_on_purpose.py": "from backend.runs.scheduler import passes\n"},
        "backend.runs in layers",
    ),
    "no service imports a tasks module": (
        {"backend/runs/services/wrong_on_purpose.py": "from backend.runs import tasks\n"},
        "No service, scheduler or state-machine module imports a tasks module",
    ),
    "no cycle in a service package": (
        {
            "backend/runs/scheduler/wrong_a.py": "from backend.runs.scheduler import wrong_b\n",
            "backend/runs/scheduler/wrong_b.py": "from backend.runs.scheduler import wrong_a\n",
        },
        "No import cycles between the modules of a service package",
    ),
    "artifacts imports only runs' models": (
        {"backend/artifacts/wrong_on_purpose.py": "from backend.runs.lifecycle import transitions\n"},
        "backend.artifacts imports nothing of backend.runs but its models",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_wrong_import_is_reported_by_its_contract(case: str, tmp_path: Path) -> None:
    modules, contract = CASES[case]
    shutil.copytree(ROOT / "backend", tmp_path / "backend", ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in modules.items():
        (tmp_path / path).write_text(text)
    command = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [command, "--no-logo", "--no-cache", "--config", str(ROOT / ".importlinter")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    broken = [line for line in result.stdout.replace("\n", " ").split(" KEPT") if " BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout

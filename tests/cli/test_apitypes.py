"""The SDK's API types (cli/trainyard/apitypes.py) are what the generator
makes of the committed schema (frontend/openapi.yaml), as the dashboard's
are: a schema change without the types regenerated fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "cli" / "scripts" / "gen_apitypes.py"
COMMITTED = ROOT / "cli" / "trainyard" / "apitypes.py"


def test_the_committed_api_types_are_generated_from_the_committed_schema(tmp_path: Path):
    fresh = tmp_path / "apitypes.py"
    done = subprocess.run([sys.executable, str(SCRIPT), "--output", str(fresh)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert fresh.read_text() == COMMITTED.read_text(), (
        "cli/trainyard/apitypes.py does not match frontend/openapi.yaml: run `make cli-api-types` and commit it"
    )

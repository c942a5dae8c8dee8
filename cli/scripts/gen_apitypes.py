"""Generates cli/trainyard/apitypes.py, the SDK's types of the REST API, from
the committed OpenAPI schema (frontend/openapi.yaml, which the dashboard's
types come from too: frontend/scripts/gen-api.mjs).

datamodel-code-generator writes TypedDicts (the JSON the client returns is
plain dicts), with ``X | None`` where the schema says ``nullable``; ruff then
formats them with the repo's ruff.toml. The output depends only on the schema
and the pinned versions in requirements.txt, so tests/cli/test_apitypes.py
can regenerate it and compare.

    python cli/scripts/gen_apitypes.py             # rewrites cli/trainyard/apitypes.py
    python cli/scripts/gen_apitypes.py -o OUT.py   # writes elsewhere (the test)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "frontend" / "openapi.yaml"
TARGET = ROOT / "cli" / "trainyard" / "apitypes.py"
COMMAND = "make cli-api-types"

HEADER = f'''"""The REST API's types: generated from frontend/openapi.yaml by
datamodel-code-generator (cli/scripts/gen_apitypes.py), never edited by hand.
`{COMMAND}` regenerates it; tests/cli/test_apitypes.py fails while it and
the schema disagree. trainyard.api names the ones the SDK returns."""'''

GENERATOR_OPTIONS = [
    "--input-file-type=openapi",
    "--output-model-type=typing.TypedDict",
    "--target-python-version=3.11",
    "--strict-nullable",  # nullable: true is `X | None`
    "--use-field-description",
    "--use-double-quotes",
    "--disable-timestamp",
    "--formatters=builtin",  # then ruff, with the repo's configuration
]


def generate(output: Path) -> None:
    """Write the types of SCHEMA to ``output``."""
    with tempfile.TemporaryDirectory() as tmp:
        header = Path(tmp) / "header.py"
        header.write_text(HEADER + "\n")
        _run(
            "datamodel_code_generator",
            f"--input={SCHEMA}",
            f"--output={output}",
            f"--custom-file-header-path={header}",
            *GENERATOR_OPTIONS,
        )
    _run("ruff", "format", "--quiet", f"--config={ROOT / 'ruff.toml'}", str(output))


def _run(module: str, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"python -m {module} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=TARGET, help=f"default: {TARGET.relative_to(ROOT)}")
    generate(parser.parse_args().output)


if __name__ == "__main__":
    main()

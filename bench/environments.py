"""Environments built once (`--only environments`): a job whose environment
is scikit-learn (numpy, scipy, joblib, threadpoolctl: real wheels from the
package index), run on the embedded default's local runners.

- **first run**: the runner builds the environment with uv (a cold uv cache:
  the bench's data dir is new); its build time is the one the server recorded.
- **second run** (median of ``reuse`` runs): the environment is reused. Its
  overhead is *accepted → first line of the commands* minus the same for a
  job without an environment, measured in this run (the baseline).
- **plain pip**: ``python3.11 -m venv`` + ``pip install scikit-learn`` into a
  fresh venv with an empty pip cache, in this process: what every run cost
  before environments.
- **restore from storage on a new runner**: the environment's folder is
  removed from the local runners' (a new machine has none), and the job runs
  again: the runner restores what the first run packed into the workspace's
  storage. The restore time is the one the runner logged.

Needs the package index (PyPI, or what ``UV_INDEX_URL`` / pip's
configuration names).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.lib import Api, log, parse_iso

PACKAGES = "scikit-learn==1.7.2"
TARGET_REUSE_OVERHEAD_S = 0.5
TARGET_RESTORE_RATIO = 3.0
MARK = "env-ready"
WORKFLOWS = f"""
  - name: env-sklearn
    provider: bash
    environment:
      python: "3.11"
      pip: ["{PACKAGES}"]
    commands:
      - python -c "print('{MARK}', flush=True); import sklearn; print('scikit-learn', sklearn.__version__)"

  - name: env-none
    provider: bash
    commands:
      - python3 -c "print('{MARK}', flush=True)"
"""


def bench_environments(api: Api, data_dir: Path, reuse: int = 3) -> dict[str, Any]:
    text = api.workflows_text.rstrip() + "\n" + WORKFLOWS
    baseline = [_overhead(api, "env-none", text)[0] for _ in range(reuse)]
    log("(env) first run: building the environment")
    first, key, _ = _overhead(api, "env-sklearn", text, timeout=900)
    detail = api.get(f"/api/v1/workspaces/{api.workspace}/environments/{key}/")
    again = [_overhead(api, "env-sklearn", text) for _ in range(reuse)]
    assert all(k == key for _, k, _ in again), (key, again)
    log("(env) a runner without it: restore from storage")
    for folder in (data_dir / "local-runners" / "environments").glob(f"*/{key}"):
        shutil.rmtree(folder)
    restore_overhead, _, lines = _overhead(api, "env-sklearn", text, timeout=900)
    said = next((line for line in lines if ": restored from storage in " in line), "")
    restore_s = float(said.split("restored from storage in ")[1].split(" s")[0]) if said else None
    log("(env) plain pip into a fresh venv")
    pip_seconds = _plain_pip()
    return {
        "packages": PACKAGES,
        "installed": detail["packages"],
        "size_bytes": detail["size_bytes"],
        "build_seconds": round(detail["build_seconds"], 2),
        "first_overhead_s": round(first, 3),
        "baseline_overhead_s": round(statistics.median(baseline), 3),
        "reuse_overhead_s": round(statistics.median(o for o, _, _ in again), 3),
        "reuse_samples": reuse,
        "restore_seconds": restore_s,
        "restore_overhead_s": round(restore_overhead, 3),
        "stored": detail["stored"] or api.get(f"/api/v1/workspaces/{api.workspace}/environments/{key}/")["stored"],
        "pip_seconds": round(pip_seconds, 2),
    }


def environment_rows(result: dict[str, Any], row: Any) -> None:
    extra = result["reuse_overhead_s"] - result["baseline_overhead_s"]
    row(
        f"environment ({result['packages']}, {result['installed']} packages), first run: uv build",
        f"{result['build_seconds']:.1f} s",
        "",
        None,
    )
    row(
        f"  second run on the same runner: environment overhead (median of {result['reuse_samples']})",
        f"{extra * 1000:.0f} ms",
        f"< {TARGET_REUSE_OVERHEAD_S * 1000:.0f} ms",
        extra < TARGET_REUSE_OVERHEAD_S,
    )
    row("  plain pip into a fresh venv, same packages (baseline)", f"{result['pip_seconds']:.1f} s", "", None)
    row(
        "  uv build vs plain pip",
        f"{result['pip_seconds'] / max(result['build_seconds'], 0.001):.1f}× faster",
        "",
        None,
    )
    restore = result["restore_seconds"]
    if restore is None:
        row("  first run on a new runner, restored from storage", "built instead (not stored)", "", False)
        return
    row(
        "  first run on a new runner: restored from storage",
        f"{restore:.1f} s ({result['pip_seconds'] / max(restore, 0.001):.1f}× faster than pip)",
        f"≥ {TARGET_RESTORE_RATIO:.0f}× faster than plain pip",
        result["pip_seconds"] / max(restore, 0.001) >= TARGET_RESTORE_RATIO,
    )


def _overhead(api: Api, workflow: str, text: str, timeout: float = 180) -> tuple[float, str, list[str]]:
    """Seconds from the runner accepting the job to the first line of its
    commands, the environment key its attempt names ("" for none), and its
    log's lines."""
    run = api.submit(workflow, workflows_text=text)
    done = api.wait_finished(run["id"], timeout=timeout)
    if done["status"] != "succeeded":
        raise RuntimeError(f"{workflow}: run {done['name']} {done['status']}: {done.get('status_reason')}")
    job = done["jobs"][0]
    attempt = job["attempts"][-1]
    accepted = parse_iso(attempt["started_at"])
    url = f"/api/v1/workspaces/{api.workspace}/jobs/{job['id']}/logs/raw"
    with api.new_client() as client:
        raw = client.get(url, params={"timestamps": 1})
        raw.raise_for_status()
    lines = [line.partition(" ") for line in raw.text.splitlines()]
    for stamp, _, body in lines:
        if body == MARK:
            first = parse_iso(stamp)
            assert first is not None and accepted is not None
            return first - accepted, attempt.get("environment") or "", [body for _, _, body in lines]
    raise RuntimeError(f"{workflow}: run {done['name']} never printed {MARK!r}")


def _plain_pip() -> float:
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-pip-") as tmp:
        venv = Path(tmp) / "venv"
        started = time.monotonic()
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
             "--cache-dir", str(Path(tmp) / "pip-cache"), PACKAGES],
            check=True,
            stdout=sys.stderr,
        )  # fmt: skip
        return time.monotonic() - started

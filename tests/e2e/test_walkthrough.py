"""The README's five-minute walkthrough, for real: tiny-train through the CLI."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.e2e.conftest import User, as_json, run_name_of


def test_hello_streams_its_output_and_exits_0(alice: User, repo: Path) -> None:
    result = alice.cli(repo, "run", "hello")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("hello from ")
    assert "Python 3" in result.stdout
    assert "submitted" in result.stderr


def test_fail_shows_stderr_and_exits_with_the_jobs_code(alice: User, repo: Path) -> None:
    result = alice.cli(repo, "run", "fail")

    assert result.returncode == 3
    assert "about to fail" in result.stderr
    name = result.stderr.split("Run ", 1)[1].split()[0]
    run = alice.run(name)
    assert (run["status"], run["exit_code"]) == ("failed", 3)
    assert run["jobs"][0]["exit_code"] == 3


def test_artifacts_download_byte_identical_with_manifest(alice: User, repo: Path, tmp_path: Path) -> None:
    name = run_name_of(alice.cli(repo, "run", "download-base-model", "-d"))
    alice.wait(name, lambda r: r["status"] == "succeeded")
    expected = (repo / "download.py").exists() and b'{"w": 0.0, "b": 0.0}'

    listed = as_json(alice.cli(repo, "artifacts", "list", name, "--json"))
    result = alice.cli(repo, "artifacts", "download", name, "-o", str(tmp_path / "out"))

    assert result.returncode == 0, result.stderr
    [artifact] = listed
    assert artifact["path"] == "./base_model" and artifact["status"] == "complete"
    assert artifact["files"] == [
        {"path": "weights.json", "size": len(expected), "sha256": hashlib.sha256(expected).hexdigest()}
    ]
    assert (tmp_path / "out" / "base_model" / "weights.json").read_bytes() == expected


def test_ps_lists_recent_runs_with_status_workflow_age_and_duration(alice: User, repo: Path) -> None:
    name = run_name_of(alice.cli(repo, "run", "hello", "-d"))
    alice.wait(name, lambda r: r["status"] == "succeeded")

    table = alice.cli(repo, "ps")
    runs = as_json(alice.cli(repo, "ps", "--json"))

    assert table.returncode == 0
    row = next(line for line in table.stdout.splitlines() if line.startswith(name))
    assert "hello" in row and "succeeded" in row
    mine = next(r for r in runs if r["name"] == name)
    assert mine["workflow"] == "hello" and mine["duration_seconds"] is not None


def test_logs_prints_a_finished_runs_whole_log(alice: User, repo: Path) -> None:
    name = run_name_of(alice.cli(repo, "run", "fail", "-d"))
    alice.wait(name, lambda r: r["status"] == "failed")

    result = alice.cli(repo, "logs", name)

    assert result.returncode == 0
    assert "about to fail" in result.stdout + result.stderr


def test_env_override_reaches_the_job_and_is_masked_in_its_log(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(
        "workflows:\n  - name: greet\n    provider: bash\n"
        '    commands: [\'test "$WHO" = override && echo "hi $WHO"\']\n    env: {WHO: file}\n'
    )
    result = alice.cli(repo, "run", "greet", "-e", "WHO=override")

    assert result.returncode == 0, result.stderr  # the job had the override, not the file's value
    assert result.stdout.strip() == "hi *****"  # an -e value is treated as a secret (docs/WORKFLOWS.md)
    assert "Sending from this shell and -e: WHO (kept encrypted, masked in logs)" in result.stderr

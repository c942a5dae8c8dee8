"""Issue 3 end to end: tiny-train's chain, tags, the cache, dependency errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import User, as_json, commit_all, run_name_of


def _jobs(user: User, name: str) -> dict[str, dict[str, object]]:
    return {j["name"]: j for j in user.run(name)["jobs"]}


def test_finetune_tag_evaluate_and_the_cached_rerun(alice: User, repo: Path, tmp_path: Path) -> None:
    first = alice.cli(repo, "run", "finetune-model", "-d")
    name = run_name_of(first)
    run = alice.wait(name, lambda r: r["status"] in {"succeeded", "failed"}, timeout=120)
    jobs = _jobs(alice, name)
    assert run["status"] == "succeeded", run
    assert list(jobs) == ["download-base-model", "finetune-model"]
    assert jobs["finetune-model"]["needs"] == ["download-base-model"]
    assert jobs["finetune-model"]["inputs"] == [{"path": "./base_model", "from": "job download-base-model"}]
    assert jobs["download-base-model"]["finished_at"] <= jobs["finetune-model"]["started_at"]

    alice.cli(repo, "artifacts", "download", name, "-o", str(tmp_path / "out"))
    final = json.loads((tmp_path / "out" / "checkpoint" / "final.json").read_text())
    assert final["steps"] == 20 and abs(final["w"] - 3) < 0.5 and abs(final["b"] - 1) < 0.5

    tagged = alice.cli(repo, "tag", "add", "best-model", name)
    tags = as_json(alice.cli(repo, "tag", "ls", "--json"))
    assert tagged.returncode == 0, tagged.stderr
    assert [(t["name"], t["run"]) for t in tags if t["name"] == "best-model"] == [("best-model", name)]

    evaluated = alice.cli(repo, "run", "evaluate")
    error = abs(final["w"] - 3) + abs(final["b"] - 1)
    assert evaluated.returncode == 0, evaluated.stderr
    assert f"error={error:.6f}" in evaluated.stdout

    again = run_name_of(alice.cli(repo, "run", "finetune-model", "-d"))
    alice.wait(again, lambda r: r["status"] == "succeeded", timeout=120)
    reused = _jobs(alice, again)
    shown = alice.cli(repo, "show", again)
    assert reused["download-base-model"]["cached_from"] == {"run": name, "job": jobs["download-base-model"]["id"]}
    assert reused["download-base-model"]["last_seq"] == 0  # it did not run again: no output at all
    assert reused["finetune-model"]["cached_from"] == {"run": name, "job": jobs["finetune-model"]["id"]}
    assert name in shown.stdout

    alice.cli(repo, "tag", "rm", "best-model")


def test_a_changed_download_script_invalidates_the_cache_and_no_cache_forces(alice: User, repo: Path) -> None:
    baseline = run_name_of(alice.cli(repo, "run", "download-base-model", "-d"))
    alice.wait(baseline, lambda r: r["status"] == "succeeded")
    cached = run_name_of(alice.cli(repo, "run", "download-base-model", "-d"))
    forced = run_name_of(alice.cli(repo, "run", "download-base-model", "-d", "--no-cache"))
    (repo / "download.py").write_text((repo / "download.py").read_text() + "\n# tweak\n")
    uncommitted = run_name_of(alice.cli(repo, "run", "download-base-model", "-d"))
    commit_all(repo, "tweak download")
    committed = run_name_of(alice.cli(repo, "run", "download-base-model", "-d"))

    results = {
        n: alice.wait(n, lambda r: r["status"] == "succeeded")["jobs"][0]
        for n in (cached, forced, uncommitted, committed)
    }

    assert results[cached]["cached_from"] is not None
    assert results[forced]["cached_from"] is None
    assert results[uncommitted]["cached_from"] is None
    assert results[committed]["cached_from"] is None


def test_dry_run_prints_the_plan_and_submits_nothing(alice: User, repo: Path) -> None:
    before = len(alice.runs())
    result = alice.cli(repo, "run", "finetune-model", "-e", "STEPS=50", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "download-base-model" in result.stdout and "finetune-model" in result.stdout
    assert len(alice.runs()) == before


CHAIN = """workflows:
  - name: a
    provider: bash
    commands: [echo a]
    deps: [{workflow: b}]
  - name: b
    provider: bash
    commands: [echo b]
    deps: [{workflow: a}]
  - name: orphan
    provider: bash
    commands: [echo o]
    deps: [{workflow: nowhere}]
  - name: needs-tag
    provider: bash
    commands: [echo t]
    deps: [{tag: no-such-tag}]
  - name: broken
    provider: bash
    commands: [exit 4]
  - name: after-broken
    provider: bash
    commands: [echo never]
    deps: [{workflow: broken}]
"""


@pytest.mark.parametrize(
    ("workflow", "message"),
    [
        ("a", "cycle"),
        ("orphan", "nowhere"),
        ("needs-tag", "tag 'no-such-tag' does not exist"),
    ],
)
def test_dependency_errors_are_refused_before_anything_runs(
    alice: User, repo: Path, workflow: str, message: str
) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(CHAIN)
    before = len(alice.runs())
    result = alice.cli(repo, "run", workflow)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(alice.runs()) == before


def test_a_failed_dependency_fails_its_dependent_with_a_reason(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(CHAIN)
    result = alice.cli(repo, "run", "after-broken")
    name = result.stderr.split("Run ", 1)[1].split()[0]
    jobs = _jobs(alice, name)
    assert result.returncode == 4
    assert jobs["after-broken"]["status"] == "failed"
    assert jobs["after-broken"]["status_reason"] == "dependency broken failed"

"""Issue 14 end to end: why each job is reused or runs, in `run --dry-run` and
`show`, and the logs of jobs reused from the cache (real stack, real CLI)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from tests.e2e.conftest import User, commit_all, git, run_name_of

DONE = {"succeeded", "failed", "stopped"}

# A job whose output differs every time it runs (stamp), and one that uses
# a tagged run's output (consume): an input that changes with the tag.
STAMPED = """
  - name: stamp
    provider: bash
    commands: ['mkdir -p out && date +%s%N > out/t']
    artifacts: [./out]
  - name: consume
    provider: bash
    commands: ['mkdir -p res && cat out/t > res/t && echo consumed']
    deps: [{tag: stamp-REPO}]
    artifacts: [./res]
"""


def _plan(alice: User, repo: Path, *args: str) -> dict[str, str]:
    """`trainyard run … --dry-run`: job name → its `cache:` line."""
    result = alice.cli(repo, "run", *args, "--dry-run")
    assert result.returncode == 0, result.stderr
    return _by_job(result.stdout, r"^\d+\. (\S+) ", r"^   cache: (.*)$")


def _shown(alice: User, repo: Path, run: str) -> dict[str, str]:
    """`trainyard show RUN`'s Cache section: job name → decision."""
    result = alice.cli(repo, "show", run)
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("\nCache:\n", 1)[1].split("\n\n", 1)[0]
    return dict(line.strip().split(": ", 1) for line in section.splitlines())


def _by_job(text: str, job_re: str, line_re: str) -> dict[str, str]:
    found, job = {}, ""
    for line in text.splitlines():
        if m := re.match(job_re, line):
            job = m.group(1)
        elif m := re.match(line_re, line):
            found[job] = m.group(1)
    return found


def _finished(alice: User, repo: Path, *args: str) -> str:
    name = run_name_of(alice.cli(repo, "run", *args, "-d"))
    run = alice.wait(name, lambda r: r["status"] in DONE, timeout=120)
    assert run["status"] == "succeeded", run
    return name


def test_dry_run_and_show_say_why_each_job_is_reused_or_runs(alice: User, repo: Path) -> None:
    assert _plan(alice, repo, "finetune-model") == {
        "download-base-model": "runs: no earlier run with this key",
        "finetune-model": "runs: no earlier run with this key",
    }
    first = _finished(alice, repo, "finetune-model")
    assert _shown(alice, repo, first) == {
        "download-base-model": "runs: no earlier run with this key",
        "finetune-model": "runs: no earlier run with this key",
    }
    cached = {"download-base-model": f"reused from {first} (cached)", "finetune-model": f"reused from {first} (cached)"}
    assert _plan(alice, repo, "finetune-model") == cached
    assert _plan(alice, repo, "finetune-model", "--no-cache") == {
        "download-base-model": "runs: --no-cache",
        "finetune-model": "runs: --no-cache",
    }
    assert _plan(alice, repo, "finetune-model", "-e", "STEPS=30") == {
        "download-base-model": "runs: env changed (STEPS)",
        "finetune-model": "runs: env changed (STEPS); input ./base_model from download-base-model, which runs first",
    }
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text().replace("memory: 256MB", "memory: 300MB"))
    assert _plan(alice, repo, "finetune-model") == {
        "download-base-model": "runs: code changed (.trainyard/workflows.yaml)",
        "finetune-model": "runs: code changed (.trainyard/workflows.yaml); spec changed (resources); "
        "input ./base_model from download-base-model, which runs first",
    }
    git(repo, "checkout", "--", ".trainyard/workflows.yaml")

    (repo / "download.py").write_text((repo / "download.py").read_text() + "\n# tweak\n")
    changed = {
        "download-base-model": "runs: code changed (download.py)",
        "finetune-model": "runs: code changed (download.py); input ./base_model from download-base-model, "
        "which runs first",
    }
    assert _plan(alice, repo, "finetune-model") == changed
    tweaked = _finished(alice, repo, "finetune-model")
    # download.py writes the same weights: finetune-model's input did not change, only the code.
    assert _shown(alice, repo, tweaked) == {
        "download-base-model": "runs: code changed (download.py)",
        "finetune-model": "runs: code changed (download.py)",
    }
    before = git(repo, "rev-parse", "HEAD").strip()
    commit_all(repo, "tweak download")
    after = git(repo, "rev-parse", "HEAD").strip()
    assert _plan(alice, repo, "download-base-model") == {
        "download-base-model": f"runs: code changed (commit {before[:7]} → {after[:7]})"
    }


def test_an_input_changed_by_a_moved_tag_is_named(alice: User, repo: Path) -> None:
    tag = f"stamp-{uuid.uuid4().hex[:8]}"
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + STAMPED.replace("stamp-REPO", tag))
    commit_all(repo, "stamped workflows")
    stamped = _finished(alice, repo, "stamp")
    assert alice.cli(repo, "tag", "add", tag, stamped).returncode == 0
    consumed = _finished(alice, repo, "consume")
    restamped = _finished(alice, repo, "stamp", "--no-cache")
    assert _shown(alice, repo, restamped) == {"stamp": "runs: --no-cache"}
    assert alice.cli(repo, "tag", "add", tag, restamped, "--force").returncode == 0

    reason = f"runs: input changed (./out from tag {tag} (run {restamped}))"
    assert _plan(alice, repo, "consume") == {"consume": reason}
    again = _finished(alice, repo, "consume")
    assert _shown(alice, repo, again) == {"consume": reason}
    assert alice.run(again)["jobs"][0]["cache_decision"] == {
        "reused": False,
        "text": reason,
        "compared_with": consumed,
        "reasons": [{"kind": "input_changed", "text": f"input changed (./out from tag {tag} (run {restamped}))"}],
    }
    alice.cli(repo, "tag", "rm", tag)


def test_logs_of_a_cached_run_print_the_source_runs_log_under_a_header(alice: User, repo: Path) -> None:
    first = _finished(alice, repo, "finetune-model")
    cached = run_name_of(alice.cli(repo, "run", "finetune-model", "-d"))
    followed = alice.cli(repo, "logs", cached, "-f", timeout=60)  # at once: the run may not be decided yet
    alice.wait(cached, lambda r: r["status"] in DONE)
    plain = alice.cli(repo, "logs", cached)
    headers_only = alice.cli(repo, "logs", cached, "--no-source")
    source = alice.cli(repo, "logs", first).stdout.splitlines()

    download = f"--- download-base-model: reused from {first} (cached) ---"
    finetune = f"--- finetune-model: reused from {first} (cached) ---"
    from_download = [line for line in source if line.startswith("[download-base-model] ")]
    from_finetune = [line for line in source if line.startswith("[finetune-model] ")]
    assert from_download == ["[download-base-model] base model written to base_model/weights.json"]
    assert from_finetune[-1].startswith("[finetune-model] done: w=")
    expected = [f"[download-base-model] {download}", *from_download, f"[finetune-model] {finetune}", *from_finetune]
    assert (followed.returncode, followed.stdout.splitlines()) == (0, expected), followed.stderr
    assert (plain.returncode, plain.stdout.splitlines()) == (0, expected), plain.stderr
    assert headers_only.stdout.splitlines() == [f"[download-base-model] {download}", f"[finetune-model] {finetune}"]


def test_run_of_a_fully_cached_workflow_says_what_was_reused_and_where_the_artifacts_are(
    alice: User, repo: Path
) -> None:
    first = _finished(alice, repo, "download-base-model")

    result = alice.cli(repo, "run", "download-base-model")

    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    name = result.stderr.split("Run ", 1)[1].split()[0]
    lines = result.stderr.splitlines()
    assert f"download-base-model: reused from {first} (cached)" in lines
    assert lines[-4:] == [
        "Every job was reused from the cache:",
        f"  download-base-model: reused from {first} (cached): ./base_model (1 file, 20 B)",
        f"Artifacts: trainyard artifacts download {first} -o DIR",
        f"Their logs: trainyard logs {name}",
    ]

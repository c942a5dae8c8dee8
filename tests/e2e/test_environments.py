"""Job environments end to end (docs/ENVIRONMENTS.md): a workflow's
``environment:`` is built once by the local runners, from a real package
index on localhost, and reused; a changed requirements file is a new key and
a new build; two jobs that need the same new key at once build it once."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.conftest import User, commit_all, run_name_of
from tests.support.pkgindex import PackageIndex, package_index
from tests.support.stack import Stack

WORKFLOWS = """workflows:
  - name: envjob
    provider: bash
    environment:
      python: "3.11"
      requirements: requirements.txt
      setup: [{setup}]
    env:
      UV_INDEX_URL: {index}
    commands:
      - python -c "import sys, tinypkg; print('tinypkg', tinypkg.VERSION, sys.prefix)"
"""
WRITES_VERSION = """      - mkdir -p out && python -c "import tinypkg; print(tinypkg.VERSION)" > out/version.txt
    artifacts: [./out]
"""
LINE = re.compile(r"^(\S+) (.*)$")


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PackageIndex]:
    with package_index(tmp_path / "index") as index:
        index.add("tinypkg", "1.0")
        yield index


def test_an_environment_is_built_once_and_the_second_run_installs_nothing(
    alice: User, repo: Path, index: PackageIndex
) -> None:
    _workflow(repo, index, requirements="tinypkg\n")

    first = _run(alice, repo)
    said = [line for line in first.lines if line.startswith("[trainyard] environment") and "other machines" not in line]
    assert len(said) == 2 and said[0].endswith(": building (python 3.11)"), first.lines
    built = said[1:]
    assert ": built in " in built[0], first.lines
    assert " + tinypkg==1.0" in first.lines
    fetched = index.downloads()
    assert set(fetched) == {"tinypkg-1.0-py3-none-any.whl"}  # resolving and installing may each fetch it
    key = built[0].split("environment ")[1].split(":")[0]
    assert first.output.startswith("tinypkg 1.0 ") and first.output.split()[-1].endswith(key)

    second = _run(alice, repo)
    assert [line for line in second.lines if "[trainyard] environment" in line] == [
        f"[trainyard] environment {key}: reused (built in {built[0].split('built in ')[1].split(' s')[0]} s)"
    ]
    assert not [line for line in second.lines if "tinypkg==" in line or "Installed" in line], second.lines
    assert index.downloads() == fetched  # nothing fetched again
    assert second.output == first.output
    # The commands started within a second of the runner accepting the job.
    assert second.first_command_at is not None
    assert (second.first_command_at - second.accepted_at).total_seconds() < 1.0, second

    # Recorded: each run names its job's environment; the workspace lists it
    # with both runs, its lock has the exact version and its hash.
    for result in (first, second):
        shown = alice.cli(repo, "show", result.run)
        assert shown.returncode == 0, shown.stderr
        assert f"Environments (trainyard env show KEY):\n  envjob  {key}\n" in shown.stdout, shown.stdout
    listed = json.loads(alice.cli(repo, "env", "ls", "--json").stdout)
    mine = next(e for e in listed if e["key"] == key)
    assert (mine["runs"], mine["packages"], mine["built_on"].startswith("local-")) == (2, 1, True)
    lock = alice.cli(repo, "env", "lock", key)
    assert lock.returncode == 0, lock.stderr
    digest = hashlib.sha256((index.root / "files" / "tinypkg-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    assert "tinypkg==1.0" in lock.stdout and f"--hash=sha256:{digest}" in lock.stdout
    detail = alice.cli(repo, "env", "show", key)
    assert "Installed:\n  tinypkg==1.0" in detail.stdout and f"runs: {second.run}, {first.run}" in detail.stdout


def test_a_changed_requirements_file_is_a_new_key_and_a_new_build(alice: User, repo: Path, index: PackageIndex) -> None:
    _workflow(repo, index, requirements="tinypkg==1.0\n")
    first = _run(alice, repo)
    index.add("tinypkg", "1.1")
    _workflow(repo, index, requirements="tinypkg==1.1\n")
    second = _run(alice, repo)

    def key(run: Result) -> str:
        line = next(line for line in run.lines if "[trainyard] environment" in line and "built in" in line)
        return line.split("environment ")[1].split(":")[0]

    assert key(first) != key(second)
    assert any(": built in " in line and "reused" not in line for line in second.lines), second.lines
    assert second.output.startswith("tinypkg 1.1 ")


def test_a_rerun_installs_the_recorded_lock_not_a_newer_release(alice: User, repo: Path, index: PackageIndex) -> None:
    _workflow(repo, index, requirements="tinypkg\n# re-run\n", artifact=True)
    first = _run(alice, repo)
    assert first.output.startswith("tinypkg 1.0 ")
    index.add("tinypkg", "1.1")  # released after the run was locked

    again = alice.cli(repo, "rerun", first.run, "-d")
    assert again.returncode == 0, again.stderr
    rerun = _wait(alice, run_name_of(again))
    assert "[trainyard] installing the recorded lock (a re-run): nothing is resolved again" in rerun.lines
    assert " + tinypkg==1.0" in rerun.lines
    assert rerun.output.startswith("tinypkg 1.0 ")

    # It really ran again (the lock is in its spec: no cache hit) and wrote
    # the same ./out/version.txt: the run page and `show` mark it reproduced.
    shown = alice.run(rerun.run)
    assert shown["jobs"][0]["cached_from"] is None
    assert (shown["rerun_of"], shown["reproduced"]) == (
        first.run,
        {"state": "reproduced", "detail": "every artifact byte-identical (1 file)", "differences": []},
    )
    assert alice.run(first.run)["reproduced"] is None
    said = alice.cli(repo, "show", rerun.run)
    assert f"Re-run of {first.run}: reproduced — every artifact byte-identical (1 file)\n" in said.stdout, said.stdout

    # A fresh resolution of the same requirements would have taken the new release.
    _workflow(repo, index, requirements="tinypkg\n# re-run, resolved again\n")
    assert _run(alice, repo).output.startswith("tinypkg 1.1 ")


def test_a_machine_without_the_environment_restores_it_from_storage(
    alice: User, repo: Path, index: PackageIndex, stack: Stack
) -> None:
    # The setup's sleep makes the build slow, as real wheels would: a restore skips it.
    _workflow(repo, index, requirements="tinypkg\n# restored\n", setup="sleep 3")
    first = _run(alice, repo)
    built = next(line for line in first.lines if ": built in " in line)
    key = built.split("environment ")[1].split(":")[0]
    # Packed into the workspace's storage before the run ended.
    assert json.loads(alice.cli(repo, "env", "show", key, "--json").stdout)["stored"] is True
    fetched = index.downloads()

    # A new machine: the workspace's environments folder without it.
    folders = list((stack.data_dir / "local-runners" / "environments").glob(f"*/{key}"))
    assert len(folders) == 1, folders
    shutil.rmtree(folders[0])

    second = _run(alice, repo)
    said = [line for line in second.lines if line.startswith(f"[trainyard] environment {key}:")]
    assert len(said) == 1 and ": restored from storage in " in said[0], second.lines
    restore_s = float(said[0].split("restored from storage in ")[1].split(" s")[0])
    build_s = float(said[0].split("(built in ")[1].split(" s")[0])
    assert build_s >= 3 and restore_s < build_s, said
    assert index.downloads() == fetched  # nothing installed from the index
    assert second.output == first.output
    assert (folders[0] / "trainyard-env.json").exists()
    alice_env = json.loads(alice.cli(repo, "env", "show", key, "--json").stdout)
    assert alice_env["runs"] == 2


def test_two_jobs_needing_the_same_new_environment_build_it_once(alice: User, repo: Path, index: PackageIndex) -> None:
    _workflow(repo, index, requirements="tinypkg\n# together\n")
    results: list[Result] = []
    threads = [threading.Thread(target=lambda: results.append(_run(alice, repo))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert len(results) == 2
    said = sorted(
        line.split(": ", 1)[1].split(" (")[0]
        for result in results
        for line in result.lines
        if line.startswith("[trainyard] environment") and ("built in" in line)
    )
    assert [s.split(" in ")[0] for s in said] == ["built", "reused"], [r.lines for r in results]
    waited = [line for r in results for line in r.lines if "another job is building it" in line]
    assert len(waited) <= 1, waited  # the second may also have arrived after the build
    assert results[0].output == results[1].output


MODEL_WORKFLOWS = """workflows:
  - name: envmodel
    provider: bash
    environment:
      python: "3.11"
      requirements: requirements.txt
    env:
      UV_INDEX_URL: {index}
    commands:
      - mkdir -p out && python -c "import tinypkg; print('tinypkg', tinypkg.VERSION)" | tee out/version.txt
    artifacts: [out]
"""


def test_env_build_ahead_then_dry_run_says_ready_and_a_changed_file_is_the_reason_to_run(
    alice: User, repo: Path, index: PackageIndex
) -> None:
    """`trainyard env build` builds on a runner of the workspace before any
    run; --dry-run says, per job, whether its environment is ready or to be
    built (and how long the last build took); a changed requirements file
    is named as the reason the job is not reused."""
    (repo / ".trainyard" / "workflows.yaml").write_text(MODEL_WORKFLOWS.format(index=index.url))
    # Its own requirements: the stack is shared, and the same recipe built by another test would be ready.
    (repo / "requirements.txt").write_text("tinypkg==1.0  # envmodel\n")
    commit_all(repo, "a model with an environment")

    before = alice.cli(repo, "run", "envmodel", "--dry-run")
    assert before.returncode == 0, before.stderr
    assert "   environment: to be built (never built before)\n" in before.stdout, before.stdout

    built = alice.cli(repo, "env", "build", "envmodel", timeout=180)
    assert built.returncode == 0, built.stdout + built.stderr
    summary = re.search(r"Environment ([0-9a-f]{24}): built in ([0-9.]+)s on (local-\w+), .*; stored", built.stderr)
    assert summary, built.stderr
    key, seconds, machine = summary.groups()
    assert f"[trainyard] environment {key}: building (python 3.11)" in built.stdout
    assert "tinypkg 1.0" not in built.stdout  # no command ran
    runs = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/runs/").json()["results"]
    assert runs[0]["environment_build"] is True and runs[0]["status"] == "succeeded"

    ready = alice.cli(repo, "run", "envmodel", "--dry-run")
    assert ready.returncode == 0, ready.stderr
    expected = (
        f"   environment: ready ({key}, built on {machine} in {seconds} s; stored, so other machines restore it)\n"
    )
    assert expected in ready.stdout, ready.stdout

    first = _wait(alice, run_name_of(_submitted(alice, repo)))
    assert [line for line in first.lines if line.startswith("[trainyard] environment")] == [
        f"[trainyard] environment {key}: reused (built in {seconds} s)"
    ]
    assert first.output == "tinypkg 1.0"

    # The same pin, written differently: a new recipe, a new build, and the job runs again, saying why.
    (repo / "requirements.txt").write_text("tinypkg == 1.0  # envmodel\n")
    commit_all(repo, "requirements reworded")
    planned = alice.cli(repo, "run", "envmodel", "--dry-run")
    assert f"   environment: to be built (the last build of this workflow took {seconds} s)\n" in planned.stdout
    assert "environment changed (requirements.txt)" in planned.stdout, planned.stdout
    second = alice.wait(
        run_name_of(_submitted(alice, repo)), lambda r: r["status"] in ("succeeded", "failed"), timeout=180
    )
    decision = second["jobs"][0]["cache_decision"]
    assert decision["reused"] is False and "environment changed (requirements.txt)" in decision["text"], decision
    assert any(r["kind"] == "environment_changed" for r in decision["reasons"]), decision


def _submitted(user: User, repo: Path) -> subprocess.CompletedProcess[str]:
    result = user.cli(repo, "run", "envmodel", "-d", timeout=120)
    assert result.returncode == 0, result.stderr
    return result


class Result:
    def __init__(self, run: str, lines: list[str], stamps: list[datetime], accepted_at: datetime) -> None:
        self.run = run
        self.lines = lines
        self.accepted_at = accepted_at
        ours = [i for i, line in enumerate(lines) if line.startswith("tinypkg ")]
        self.output = lines[ours[0]] if ours else ""
        self.first_command_at = stamps[ours[0]] if ours else None

    def __repr__(self) -> str:
        return f"Result(accepted_at={self.accepted_at}, first_command_at={self.first_command_at}, lines={self.lines})"


def _workflow(repo: Path, index: PackageIndex, *, requirements: str, setup: str = "", artifact: bool = False) -> None:
    """``artifact``: the job also writes the version it imported to ./out (the same bytes for the same lock)."""
    text = WORKFLOWS.format(index=index.url, setup=setup) + (WRITES_VERSION if artifact else "")
    (repo / ".trainyard" / "workflows.yaml").write_text(text)
    (repo / "requirements.txt").write_text(requirements)
    commit_all(repo, "environment workflow")


def _run(user: User, repo: Path) -> Result:
    result = user.cli(repo, "run", "envjob", "-d", timeout=120)
    assert result.returncode == 0, result.stderr
    return _wait(user, run_name_of(result))


def _wait(user: User, name: str) -> Result:
    run = user.wait(name, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=180)
    job = run["jobs"][0]
    raw = user.api("GET", f"/api/v1/workspaces/{user.workspace}/jobs/{job['id']}/logs/raw?timestamps=1")
    raw.raise_for_status()
    lines, stamps = [], []
    for text in raw.text.splitlines():
        match = LINE.match(text)
        assert match, text
        stamps.append(datetime.fromisoformat(match.group(1).replace("Z", "+00:00")))
        lines.append(match.group(2))
    assert run["status"] == "succeeded", (run, lines)
    accepted = datetime.fromisoformat(job["attempts"][-1]["started_at"].replace("Z", "+00:00"))
    return Result(name, lines, stamps, accepted)

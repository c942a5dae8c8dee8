"""The flags people reach for every day, against the running stack: naming a
run by tag or as a workflow's latest, narrowing `logs`, overriding resources
on `run` and the dashboard link it prints, and `ps`'s filters, wide columns
and `--watch` redrawing in a terminal (docs/CLI.md)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import TRAINYARD, User, as_json, commit_all, run_name_of
from tests.support.stack import Stack

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z "

DAILY = """workflows:
  - name: steps
    provider: bash
    commands:
      - for i in 1 2 3 4 5; do echo "step $i"; done
      - echo "a warning" >&2

  - name: prepare
    provider: bash
    commands:
      - echo "preparing"

  - name: pair
    provider: bash
    deps:
      - workflow: prepare
    commands:
      - echo "paired"

  - name: flaky
    provider: bash
    retry:
      on_events: [error]
      limit: 2
    commands:
      - if [ -e "$MARK" ]; then echo "second try"; else touch "$MARK"; echo "first try"; exit 1; fi

  - name: waiter
    provider: bash
    commands:
      - echo "waiting"
      - while [ ! -e "$GO" ]; do sleep 0.2; done
      - echo "went"

  - name: sized
    provider: bash
    resources:
      cpu: 2
      memory: 512MB
    commands:
      - echo "sized"
"""


@pytest.fixture(scope="module")
def gus(stack: Stack) -> User:
    return User("gus", stack.issue_token("gus"), stack)


@pytest.fixture(scope="module")
def hedy(stack: Stack) -> User:
    return User("hedy", stack.issue_token("hedy"), stack)


@pytest.fixture(scope="module")
def ivo(stack: Stack) -> User:
    return User("ivo", stack.issue_token("ivo"), stack)


@pytest.fixture
def daily(repo: Path) -> Path:
    (repo / ".trainyard" / "workflows.yaml").write_text(DAILY)
    commit_all(repo, "daily workflows")
    return repo


def _finished(user: User, repo: Path, *args: str) -> str:
    name = run_name_of(user.cli(repo, "run", *args, "-d"))
    run = user.wait(name, lambda r: r["status"] in {"succeeded", "failed", "stopped"}, timeout=120)
    assert run["status"] == "succeeded", run
    return name


# ---------------------------------------------------------------- naming a run


def test_a_tag_and_a_workflows_latest_name_a_run_wherever_one_is_taken(gus: User, daily: Path) -> None:
    older = _finished(gus, daily, "steps")
    newer = _finished(gus, daily, "steps")
    tagged = gus.cli(daily, "tag", "add", "good-steps", older)
    assert tagged.returncode == 0, tagged.stderr

    assert as_json(gus.cli(daily, "show", "tag:good-steps", "--json"))["name"] == older
    assert as_json(gus.cli(daily, "show", "steps@latest", "--json"))["name"] == newer
    assert gus.cli(daily, "logs", "tag:good-steps").stdout.splitlines()[:5] == [f"step {i}" for i in range(1, 6)]
    listed = gus.cli(daily, "artifacts", "list", "steps@latest")
    assert listed.returncode == 0, listed.stderr

    missing_tag = gus.cli(daily, "logs", "tag:no-such-tag")
    assert missing_tag.returncode == 1
    assert "Tag 'no-such-tag' not found" in missing_tag.stderr
    missing_workflow = gus.cli(daily, "show", "never-ran@latest")
    assert missing_workflow.returncode == 1
    assert "Workflow 'never-ran' has no runs in this workspace." in missing_workflow.stderr


# ---------------------------------------------------------------- logs


def test_logs_tail_timestamps_and_job_narrow_what_is_printed(gus: User, daily: Path) -> None:
    name = _finished(gus, daily, "steps")

    tail = gus.cli(daily, "logs", name, "--tail", "2")
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.splitlines() == ["step 5", "a warning"]

    stamped = gus.cli(daily, "logs", name, "--timestamps", "--tail", "3").stdout.splitlines()
    assert len(stamped) == 3
    assert all(re.fullmatch(STAMP + r"(step \d|a warning)", line) for line in stamped), stamped

    pair = _finished(gus, daily, "pair")
    only = gus.cli(daily, "logs", pair, "--job", "prepare")
    assert only.returncode == 0, only.stderr
    assert only.stdout.splitlines() == ["[prepare] preparing"]
    unknown = gus.cli(daily, "logs", pair, "--job", "nope")
    assert unknown.returncode == 1
    assert f"error: run {pair} has no job 'nope'; its jobs: prepare, pair" in unknown.stderr


def test_logs_follow_with_tail_timestamps_and_job_prints_the_live_jobs_new_lines(
    gus: User, daily: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go-follow"
    name = run_name_of(gus.cli(daily, "run", "waiter", "-d", "-e", f"GO={go}"))
    gus.wait(name, lambda r: r["status"] == "running" and r["jobs"][0]["last_seq"] >= 1, timeout=60)
    env = {**os.environ, "TRAINYARD_URL": gus.stack.url, "TRAINYARD_TOKEN": gus.token, "HOME": str(daily.parent)}
    follower = subprocess.Popen(
        [str(TRAINYARD), "logs", name, "-f", "--tail", "1", "--timestamps", "--job", "waiter"],
        cwd=daily,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    first = follower.stdout.readline()  # the tail, printed before following
    assert re.fullmatch(STAMP + "waiting\n", first), first
    go.touch()
    rest, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert re.fullmatch(STAMP + "went\n", rest), rest


def test_logs_attempt_prints_one_attempts_lines(gus: User, daily: Path, tmp_path: Path) -> None:
    name = _finished(gus, daily, "flaky", "-e", f"MARK={tmp_path / 'flaky-mark'}")
    assert len(gus.run(name)["jobs"][0]["attempts"]) == 2

    first = gus.cli(daily, "logs", name, "--attempt", "1")
    assert first.returncode == 0, first.stderr
    assert "first try" in first.stdout and "second try" not in first.stdout
    second = gus.cli(daily, "logs", name, "--attempt", "2")
    assert "second try" in second.stdout and "first try" not in second.stdout
    whole = gus.cli(daily, "logs", name).stdout
    assert whole.index("first try") < whole.index("second try")

    third = gus.cli(daily, "logs", name, "--attempt", "3")
    assert third.returncode == 1
    assert "error: job flaky has no attempt 3 (it has attempts 1 to 2)" in third.stderr
    followed = gus.cli(daily, "logs", name, "--attempt", "1", "-f")
    assert followed.returncode == 2
    assert "--attempt prints an attempt's stored lines" in followed.stderr


# ---------------------------------------------------------------- run overrides


def test_run_overrides_every_jobs_resources_and_prints_the_runs_page(hedy: User, daily: Path) -> None:
    submitted = hedy.cli(daily, "run", "sized", "--cpu", "1", "--memory", "256MB", "-d")
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)
    assert f"View: {hedy.stack.url}/w/{hedy.workspace}/runs/{name}\n" in submitted.stderr
    job = hedy.run(name)["jobs"][0]
    assert job["resources"]["cpu"] == 1
    assert job["resources"]["memory_bytes"] == 256 * 2**20
    hedy.wait(name, lambda r: r["status"] == "succeeded", timeout=120)

    again = hedy.cli(daily, "rerun", name, "-d")
    assert again.returncode == 0, again.stderr
    rerun = hedy.run(run_name_of(again))["jobs"][0]
    assert (rerun["resources"]["cpu"], rerun["resources"]["memory_bytes"]) == (1, 256 * 2**20)

    planned = hedy.cli(daily, "run", "sized", "--gpu", "A10G:2", "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert "A10G" in planned.stdout and "2" in planned.stdout


def test_a_bad_resource_override_is_refused_before_anything_is_sent(hedy: User, daily: Path) -> None:
    before = len(hedy.runs())
    memory = hedy.cli(daily, "run", "sized", "--memory", "lots")
    assert memory.returncode == 2
    assert "Invalid value for --memory:" in memory.stderr and "'lots'" in memory.stderr
    gpu = hedy.cli(daily, "run", "sized", "--gpu", "A10G:x")
    assert gpu.returncode == 2
    assert "Invalid value for --gpu:" in gpu.stderr
    assert "Traceback" not in memory.stderr + gpu.stderr
    assert len(hedy.runs()) == before

    # The API checks the same keys as the file (a client other than the CLI).
    body = {"workflow": "sized", "code": {"kind": "git", "repo_url": "https://example.com/r.git", "commit": "0" * 40}}
    answer = hedy.api(
        "POST",
        f"/api/v1/workspaces/{hedy.workspace}/runs/",
        json={
            **body,
            "workflows_file": {"path": ".trainyard/workflows.yaml", "text": DAILY},
            "resources": {"gpu": "A10G:x"},
        },
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["message"].startswith("resources.gpu: ")


# ---------------------------------------------------------------- ps


def test_ps_filters_on_the_server_and_shows_wide_columns(ivo: User, daily: Path, tmp_path: Path) -> None:
    done = _finished(ivo, daily, "steps")
    waiting = run_name_of(ivo.cli(daily, "run", "waiter", "-d", "-e", f"GO={tmp_path / 'go'}"))
    ivo.wait(waiting, lambda r: r["status"] == "running", timeout=60)
    ivo.cli(daily, "tag", "add", "ivo-steps", done)

    def names(*args: str) -> list[str]:
        return [r["name"] for r in as_json(ivo.cli(daily, "ps", "--json", *args))]

    assert waiting in names("--status", "running") and done not in names("--status", "running")
    assert done in names("--status", "succeeded,failed") and waiting not in names("--status", "succeeded,failed")
    assert names("--workflow", "waiter") == [waiting]
    assert names("--tag", "ivo-steps") == [done]
    assert {done, waiting} <= set(names("--mine"))
    bad = ivo.cli(daily, "ps", "--status", "runing")
    assert bad.returncode == 2 and "unknown status 'runing'" in bad.stderr

    wide = ivo.cli(daily, "ps", "-v", "--workflow", "waiter")
    header, row = wide.stdout.splitlines()[:2]
    assert header.split()[-4:] == ["BACKEND", "GPU", "PRICE", "ATTEMPTS"]  # a running run has no REASON
    assert row.split()[0] == waiting
    assert row.split()[-4:] == ["local", "-", "$0.00/h", "1"]
    (tmp_path / "go").touch()
    ivo.wait(waiting, lambda r: r["status"] == "succeeded", timeout=60)


def test_ps_watch_redraws_in_place_as_a_run_changes_state(ivo: User, daily: Path, tmp_path: Path) -> None:
    name = run_name_of(ivo.cli(daily, "run", "waiter", "-d", "-e", f"GO={tmp_path / 'go-watch'}"))
    main, terminal = pty.openpty()
    env = {
        **os.environ,
        "TRAINYARD_URL": ivo.stack.url,
        "TRAINYARD_TOKEN": ivo.token,
        "HOME": str(daily.parent),
        "COLUMNS": "160",
        "LINES": "40",
    }
    process = subprocess.Popen(
        [str(TRAINYARD), "ps", "--watch", "--interval", "0.5", "--workflow", "waiter", "-n", "1"],
        cwd=daily,
        env=env,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    screen = _Screen(main)
    try:
        screen.wait_for(rf"{name}\s+waiter\s+running", timeout=60)
        (tmp_path / "go-watch").touch()
        screen.wait_for(rf"{name}\s+waiter\s+succeeded", timeout=60)
        # In place: the table was redrawn over itself (cursor moved up), not printed again below.
        assert re.search(r"\x1b\[\d*A", screen.text), "no cursor-up: the table was not redrawn in place"
        assert screen.text.count("Ctrl-C to stop") >= 2
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(main)


class _Screen:
    """What a terminal has been sent, read as it arrives."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.text = ""

    def wait_for(self, pattern: str, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self._plain()):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the terminal never showed {pattern!r}; it showed:\n{self._plain()[-2000:]}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if ready:
                try:
                    self.text += os.read(self.fd, 65536).decode(errors="replace")
                except OSError:
                    raise AssertionError(f"the terminal closed before showing {pattern!r}") from None

    def _plain(self) -> str:
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", self.text)


# ---------------------------------------------------------------- shell completion


def test_bash_completes_commands_runs_tags_and_workflows_from_the_server(
    gus: User, hedy: User, daily: Path, tmp_path: Path
) -> None:
    name = _finished(gus, daily, "prepare")
    assert gus.cli(daily, "tag", "add", "gus-prepared", name).returncode == 0
    script = gus.cli(daily, "completion", "bash")
    assert script.returncode == 0, script.stderr
    (tmp_path / "completion.bash").write_text(script.stdout)

    def complete(user: User, *words: str) -> list[str]:
        """What bash offers for ``words`` (the last being typed), through the sourced script."""
        line = " ".join(f"'{w}'" for w in words)
        program = (
            f"source {tmp_path / 'completion.bash'}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
            f'_trainyard_completion trainyard; printf "%s\\n" "${{COMPREPLY[@]}}"'
        )
        env = {
            **os.environ,
            "TRAINYARD_URL": user.stack.url,
            "TRAINYARD_TOKEN": user.token,
            "HOME": str(daily.parent),
            "PATH": f"{TRAINYARD.parent}:{os.environ['PATH']}",
        }
        done = subprocess.run(["bash", "-c", program], cwd=daily, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [w for w in done.stdout.splitlines() if w]

    assert "logs" in complete(gus, "trainyard", "lo")
    offered = complete(gus, "trainyard", "logs", name)
    assert name in offered and all(run.startswith(name) for run in offered)
    assert complete(gus, "trainyard", "show", "tag:gus-p") == ["tag:gus-prepared"]
    assert complete(gus, "trainyard", "logs", "prepare@") == ["prepare@latest"]
    assert "prepare" in complete(gus, "trainyard", "ps", "--workflow", "prep")
    assert {"steps", "pair", "waiter"} <= set(complete(gus, "trainyard", "run", ""))  # the repo's files
    assert name not in complete(hedy, "trainyard", "logs", "")  # another workspace's runs are not offered

    names = gus.api("GET", f"/api/v1/workspaces/{gus.workspace}/names/", params={"kind": "run", "prefix": ""})
    assert names.status_code == 200 and len(names.json()["names"]) <= 50
    bad = gus.api("GET", f"/api/v1/workspaces/{gus.workspace}/names/", params={"kind": "secret"})
    assert bad.status_code == 400
    assert bad.json()["message"] == "kind must be one of run, workflow, tag, environment, not 'secret'."

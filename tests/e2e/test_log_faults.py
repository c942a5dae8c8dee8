"""Log shipping through a bad network, and the end of every log checked.

A registered runner reaches the stack only through a fault-injecting proxy
(tests/support/faultproxy.py); its job prints numbered lines while the proxy
blackholes the link for 30 s, resets it every 2 s, or throttles it to 1 KB/s.
Each time every line is stored once, in order, and the runner's final count
and digest agree with the server's. The server losing a batch it
acknowledged (TRAINYARD_TEST_DROP_LOG_BATCHES) is noticed at the end, and a
workspace's log cap keeps a marker line and lets the job finish."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import User, commit_all, make_repo, run_name_of
from tests.e2e.test_self_hosted import Runner, _register
from tests.support.faultproxy import FaultProxy
from tests.support.stack import Stack

# cpu: 64 — only the registered machine behind the proxy can take it.
PACED = """workflows:
  - name: paced
    provider: bash
    commands:
      - python paced.py
    resources:
      cpu: 64
"""
# A numbered line every EVERY seconds until the test creates $DONE (at least
# MIN lines), then a last line that says how many came before.
PACED_PY = """import os, sys, time
every, least = float(os.environ.get("EVERY", "0.02")), int(os.environ.get("MIN", "0"))
i = 0
while i < least or not os.path.exists(os.environ["DONE"]):
    print(f"line {i:06d} the quick brown fox", flush=True)
    i += 1
    time.sleep(every)
print(f"end {i}", flush=True)
"""


class Machine:
    def __init__(self, user: User, proxy: FaultProxy, runner: Runner, repo: Path) -> None:
        self.user, self.proxy, self.runner, self.repo = user, proxy, runner, repo

    def start_paced(self, done: Path, **env: str) -> str:
        extra = [arg for key, value in {"DONE": str(done), **env}.items() for arg in ("-e", f"{key}={value}")]
        return run_name_of(self.user.cli(self.repo, "run", "paced", "-d", *extra))


@pytest.fixture(scope="module")
def machine(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    """Dora's registered machine, whose every byte to and from the server goes through the proxy."""
    dora = User("logan", stack.issue_token("logan"), stack)
    proxy = FaultProxy(stack.port).start()
    work = tmp_path_factory.mktemp("dora")
    made = dora.api("POST", f"/api/v1/workspaces/{dora.workspace}/runners/registration-tokens/", json={"note": "x"})
    assert made.status_code == 201, made.text
    registered = _register(work / "machine", proxy.url, made.json()["token"], "--name", "behind-proxy")
    assert registered.returncode == 0, registered.stderr
    runner = Runner(work / "machine")
    runner.start()
    runner.wait_connected(1)
    repo = make_repo(work / "tiny-train")
    (repo / ".trainyard" / "workflows.yaml").write_text(PACED)
    (repo / "paced.py").write_text(PACED_PY)
    commit_all(repo, "paced")
    try:
        yield Machine(dora, proxy, runner, repo)
    finally:
        runner.stop()
        proxy.close()


@pytest.fixture
def link(machine: Machine) -> Iterator[Machine]:
    """The machine, reachable and idle, its link healthy; and afterwards
    reachable again within seconds (not fenced 120 s later: a runner whose
    connection outlived the fault is heard again by its heartbeats)."""
    machine.proxy.passthrough()
    _wait_runner(machine.user, "idle")
    yield machine
    machine.proxy.passthrough()
    _wait_runner(machine.user, "idle")


def test_30s_of_blackhole_mid_stream_loses_and_repeats_no_line(link: Machine, tmp_path: Path) -> None:
    done = tmp_path / "done"
    name = link.start_paced(done)
    _wait_lines(link.user, name, 100)

    link.proxy.blackhole()
    time.sleep(30)
    link.proxy.passthrough()
    _wait_lines(link.user, name, _job(link.user, name)["last_seq"] + 50, timeout=90)
    done.touch()

    _assert_whole_log(link.user, name)


def test_a_reset_every_2s_loses_and_repeats_no_line(link: Machine, tmp_path: Path) -> None:
    done = tmp_path / "done"
    name = link.start_paced(done)
    _wait_lines(link.user, name, 50)

    resets = link.proxy.resets
    link.proxy.reset_every(2.0)
    time.sleep(12)
    link.proxy.passthrough()
    done.touch()

    _assert_whole_log(link.user, name)
    assert link.proxy.resets - resets >= 5


def test_1kb_per_second_loses_and_repeats_no_line(link: Machine, tmp_path: Path) -> None:
    done = tmp_path / "done"
    done.touch()  # MIN lines, then the end
    link.proxy.slow(1024)
    name = link.start_paced(done, MIN="100", EVERY="0.01")

    _assert_whole_log(link.user, name, timeout=180)


def test_a_batch_the_server_lost_is_noticed_at_the_end_of_the_log(alice: User, repo: Path, tmp_path: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(PACED.replace("cpu: 64", "cpu: 1"))
    (repo / "paced.py").write_text(PACED_PY)
    done = tmp_path / "done"
    done.touch()
    drops = alice.stack.data_dir / "drop-log-batches"
    name = run_name_of(
        alice.cli(repo, "run", "paced", "-d", "-e", f"DONE={done}", "-e", "MIN=300", "-e", "EVERY=0.005")
    )
    _wait_lines(alice, name, 20)
    drops.write_text("lose the next batch\n")

    # The check runs right after the final state is stored: wait for its note too.
    run = alice.wait(
        name, lambda r: r["status"] in {"succeeded", "failed"} and bool(r["jobs"][0]["log_note"]), timeout=120
    )

    assert drops.read_text() == ""  # the hook did lose one
    job = run["jobs"][0]
    assert run["status"] == "succeeded", run
    assert job["log_note"].startswith("log check failed for attempt 1: the server received "), job
    assert job["log_note"].endswith("lines; the stored log is incomplete")
    shown = alice.cli(repo, "show", name)
    assert "Logs:" in shown.stdout and "log check failed" in shown.stdout


def test_past_the_workspace_log_cap_a_marker_is_kept_and_the_job_succeeds(stack: Stack, tmp_path: Path) -> None:
    erin = User("leah", stack.issue_token("leah"), stack)
    slug = erin.workspace
    stack.manage(
        "shell", "-c",
        f"from backend.accounts.models import Workspace; Workspace.objects.filter(slug={slug!r}).update(log_cap_bytes=20000)",
    )  # fmt: skip
    repo = make_repo(tmp_path / "tiny-train")
    (repo / ".trainyard" / "workflows.yaml").write_text(PACED.replace("cpu: 64", "cpu: 1"))
    (repo / "paced.py").write_text(PACED_PY)
    commit_all(repo, "paced")
    done = tmp_path / "done"
    done.touch()
    name = run_name_of(erin.cli(repo, "run", "paced", "-d", "-e", f"DONE={done}", "-e", "MIN=2000", "-e", "EVERY=0"))

    run = erin.wait(name, lambda r: r["status"] in {"succeeded", "failed"}, timeout=120)

    assert run["status"] == "succeeded", run
    job = run["jobs"][0]
    stored = _stored(erin, job["id"])
    marker = "[trainyard] log limit of 19.5 KiB reached; further output is dropped"
    texts = [text for _, text in stored]
    assert texts[:-1] == [f"line {i:06d} the quick brown fox" for i in range(len(texts) - 1)]
    line = len("line 000000 the quick brown fox")
    assert texts[-1] == marker and len(texts) == 20000 // line + 1
    assert job["last_seq"] == 2001  # every line was received and acknowledged, and the job ran on
    assert (
        job["log_note"]
        == f"log limit of 19.5 KiB reached at line {len(texts)}: later output was not stored (the job ran on)"
    )
    # A finished job's log is its raw read-back, in the order printed: the
    # marker ends it; the note is the CLI's own words, on stderr.
    printed = erin.cli(repo, "logs", name)
    assert printed.stdout.splitlines()[-2:] == ["line 000644 the quick brown fox", marker]
    assert printed.stderr.splitlines() == [f"trainyard: {job['log_note']}"]


# ---------------------------------------------------------------- helpers


def _job(user: User, name: str) -> dict[str, Any]:
    return user.run(name)["jobs"][0]  # type: ignore[no-any-return]


def _wait_runner(user: User, status: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        found = user.api("GET", f"/api/v1/workspaces/{user.workspace}/runners/").json()
        if found and found[0]["status"] == status:
            return
        assert time.monotonic() < deadline, f"the machine did not become {status}: {found}"
        time.sleep(0.3)


def _wait_lines(user: User, name: str, count: int, timeout: float = 60) -> None:
    user.wait(name, lambda r: r["jobs"][0]["last_seq"] >= count, timeout=timeout)


def _stored(user: User, job: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    after = 0
    while True:
        page = user.api(
            "GET", f"/api/v1/workspaces/{user.workspace}/jobs/{job}/logs/", params={"after_seq": after}
        ).json()
        out += [(line["seq"], line["text"]) for line in page["lines"]]
        if not page["has_more"]:
            return out
        after = out[-1][0]


def _assert_whole_log(user: User, name: str, timeout: float = 120) -> None:
    """The run succeeded; its stored log is every line once, in order, and
    the runner's count and digest matched the server's (no log note)."""
    run = user.wait(name, lambda r: r["status"] in {"succeeded", "failed"}, timeout=timeout)
    assert run["status"] == "succeeded", run
    job = run["jobs"][0]
    stored = _stored(user, job["id"])
    assert stored, "nothing was stored"
    last = stored[-1][1]
    assert last.startswith("end "), last
    count = int(last.split()[1])
    assert [seq for seq, _ in stored] == list(range(1, count + 2))
    assert [text for _, text in stored[:-1]] == [f"line {i:06d} the quick brown fox" for i in range(count)]
    assert job["log_note"] == "", job

"""Log delivery: every line stored exactly once and in order, even when the
server cuts the runner's websocket mid-stream; followers see it live."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import TRAINYARD, User, run_name_of

LINES = 200_000


def _expected(n: int) -> list[str]:
    return [f"line {i:09d} the quick brown fox jumps over the lazy dog" for i in range(n)]


def _stored(alice: User, job: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    after = 0
    while True:
        page = alice.api(
            "GET", f"/api/v1/workspaces/{alice.workspace}/jobs/{job}/logs/", params={"after_seq": after, "limit": 10000}
        ).json()
        out += [(line["seq"], line["text"]) for line in page["lines"]]
        if not page["has_more"]:
            return out
        after = out[-1][0]


def test_200k_lines_are_stored_once_in_order_and_logs_returns_all(alice: User, repo: Path) -> None:
    name = run_name_of(alice.cli(repo, "run", "noisy", "-d", "-e", f"LINES={LINES}"))
    run = alice.wait(name, lambda r: r["status"] in {"succeeded", "failed"}, timeout=180)
    assert run["status"] == "succeeded"

    stored = _stored(alice, run["jobs"][0]["id"])
    printed = alice.cli(repo, "logs", name, timeout=180)

    assert [seq for seq, _ in stored] == list(range(1, LINES + 1))
    assert [text for _, text in stored] == _expected(LINES)
    assert printed.stdout.splitlines() == _expected(LINES)
    assert run["jobs"][0]["log_note"] == ""  # the runner's final count and digest matched the server's


PACED = """workflows:
  - name: paced
    provider: bash
    commands:
      - python paced.py
"""
# Bursts of 5,000 lines half a second apart, at least 40 of them (200,000
# lines), and on until the test has cut the connection five times: the job
# waits for the test's file, so a slow `manage.py` on a loaded machine never
# makes it end before the cuts. Its last line says how many lines came before.
PACED_PY = """import os, sys, time
out, burst = sys.stdout, 0
while burst < 40 or not os.path.exists(os.environ["CUTS_DONE"]):
    for i in range(burst * 5000, (burst + 1) * 5000):
        out.write(f"line {i:09d} the quick brown fox jumps over the lazy dog\\n")
    out.flush()
    burst += 1
    time.sleep(0.5)
print(f"end {burst * 5000}", flush=True)
"""


def test_lines_survive_the_server_cutting_the_runner_off_repeatedly(alice: User, repo: Path, tmp_path: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(PACED)
    (repo / "paced.py").write_text(PACED_PY)
    done = tmp_path / "cuts-done"
    name = run_name_of(alice.cli(repo, "run", "paced", "-d", "-e", f"CUTS_DONE={done}"))
    alice.wait(name, lambda r: r["jobs"][0]["last_seq"] > 0, timeout=60)
    cuts = 0
    while alice.run(name)["status"] == "running" and cuts < 5:
        alice.stack.manage("disconnect_runners")
        cuts += 1
        time.sleep(1.0)
    done.touch()
    run = alice.wait(name, lambda r: r["status"] in {"succeeded", "failed"}, timeout=180)

    stored = _stored(alice, run["jobs"][0]["id"])

    assert cuts == 5, f"the job ended after {cuts} cuts"
    assert run["status"] == "succeeded"
    count = int(stored[-1][1].split()[1])
    assert count >= LINES
    assert [seq for seq, _ in stored] == list(range(1, count + 2))
    assert [text for _, text in stored] == [*_expected(count), f"end {count}"]
    assert run["jobs"][0]["log_note"] == ""  # the end-of-log check agreed across the cuts


def test_a_follower_sees_lines_while_the_job_is_still_running(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(
        "workflows:\n  - name: ticks\n    provider: bash\n"
        "    commands: ['for i in 1 2 3 4 5; do echo tick $i; sleep 0.4; done']\n"
    )
    env = {**os.environ, "TRAINYARD_URL": alice.stack.url, "TRAINYARD_TOKEN": alice.token, "HOME": str(repo.parent)}
    seen: list[tuple[float, str]] = []
    started = time.monotonic()

    with subprocess.Popen(
        [str(TRAINYARD), "run", "ticks"], cwd=repo, env=env, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append((time.monotonic() - started, line.strip()))
        code = proc.wait(timeout=60)

    assert code == 0
    assert [text for _, text in seen] == [f"tick {i}" for i in range(1, 6)]
    # Live, not at the end: the first tick arrives well before the last one.
    assert seen[-1][0] - seen[0][0] > 1.2


ODD = """workflows:
  - name: odd
    provider: bash
    commands:
      - python odd.py
"""
# Bytes a log viewer finds hard: a carriage return inside a line, bytes that
# are not UTF-8, non-ASCII text, a line longer than the protocol's 64 KiB,
# and stderr between stdout lines (the pauses keep the two streams' order).
ODD_PY = r"""import sys, time
out = sys.stdout.buffer
out.write(b"progress 10%\rprogress 100%\n")
out.write(b"bad \xff\xfe bytes\n")
out.write("\u00e9 \u65e5\u672c \U0001f680\n".encode())
out.write(b"x" * 100000 + b"\n")
out.flush()
time.sleep(1)
sys.stderr.write("to stderr\n")
sys.stderr.flush()
time.sleep(1)
print("after", flush=True)
"""
# What the runner keeps of it (docs/RUNNER.md, "Logs"): invalid UTF-8 as
# U+FFFD, a long line as 64 KiB pieces, each on its own line.
ODD_STORED = (
    "progress 10%\rprogress 100%\n"
    "bad \ufffd\ufffd bytes\n"
    "\u00e9 \u65e5\u672c \U0001f680\n" + "x" * 65536 + "\n" + "x" * 34464 + "\n"
    "to stderr\n"
    "after\n"
).encode()


def test_a_finished_jobs_raw_log_and_trainyard_logs_are_what_it_printed(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(ODD)
    (repo / "odd.py").write_text(ODD_PY)
    name = run_name_of(alice.cli(repo, "run", "odd", "-d"))
    run = alice.wait(name, lambda r: r["status"] in {"succeeded", "failed"}, timeout=120)
    job = run["jobs"][0]["id"]
    env = {**os.environ, "TRAINYARD_URL": alice.stack.url, "TRAINYARD_TOKEN": alice.token, "HOME": str(repo.parent)}

    raw = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/jobs/{job}/logs/raw")
    printed = subprocess.run([str(TRAINYARD), "logs", name], cwd=repo, env=env, capture_output=True, timeout=60)
    paged = "".join(text + "\n" for _, text in _stored(alice, job)).encode()

    assert run["status"] == "succeeded"
    assert (raw.status_code, raw.headers["content-type"]) == (200, "text/plain; charset=utf-8")
    assert raw.content == ODD_STORED
    assert (printed.returncode, printed.stdout, printed.stderr) == (0, ODD_STORED, b"")
    assert paged == ODD_STORED

    # Archived (as the beat does TRAINYARD_LOG_ARCHIVE_AFTER_SECONDS after the
    # job ended): the same bytes from the object in storage, by every way.
    archived = alice.stack.manage(
        "shell",
        "-c",
        f"from backend.runs.services.logarchive import log_archive_job; print(log_archive_job(job_id={job!r}).size)",
    )
    assert int(archived.strip().splitlines()[-1]) == len(ODD_STORED)
    download = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/jobs/{job}/logs/raw?download=1")
    again = subprocess.run([str(TRAINYARD), "logs", name], cwd=repo, env=env, capture_output=True, timeout=60)
    assert download.status_code == 302
    assert httpx.get(download.headers["location"], timeout=30).content == ODD_STORED
    assert alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/jobs/{job}/logs/raw").content == ODD_STORED
    assert (again.returncode, again.stdout, again.stderr) == (0, ODD_STORED, b"")
    assert "".join(text + "\n" for _, text in _stored(alice, job)).encode() == ODD_STORED

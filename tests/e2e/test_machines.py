"""Downloads and machines against the real stack (docs/CLI.md, "Artifacts and
progress" and "Machines").

Jade downloads a run's artifacts several at once, picks files with ``--path``,
continues a cut-off file from its ``.trainyard-part`` (a Range request; the
line says so and the whole file's sha256 is checked), and terminates the idle
machine her run left from the CLI. Kurt terminates his from the dashboard's
"Runners & instances" page in Chromium, after its confirmation, and the page
passes the accessibility audit.
"""

from __future__ import annotations

import hashlib
import os
import pty
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, expect
from trainyard.output import size

from tests.e2e.conftest import FINISHED, TRAINYARD, User, commit_all, make_repo, run_name_of
from tests.e2e.test_dashboard import nav_to, screenshot
from tests.e2e.test_dashboard_metrics import signed_in
from tests.support.accessibility import audit
from tests.support.github import GithubServer, GithubUser
from tests.support.stack import Stack

KURT = GithubUser(id=5811, login="kurt", name="Kurt Lindqvist")
MIB = 1 << 20

SHARDS = """\
workflows:
  - name: shards
    provider: bash
    commands:
      - mkdir -p shards notes
      - for i in 0 1 2; do head -c 3145728 /dev/urandom > shards/part-$i.bin; done
      - echo "three shards of noise" > notes/readme.txt
    artifacts:
      - ./shards
      - ./notes
"""


@pytest.fixture(scope="module")
def jade(stack: Stack) -> User:
    return User("jade", stack.issue_token("jade"), stack)


def finished(user: User, name: str) -> dict[str, Any]:
    run = user.wait(name, lambda r: r["status"] in FINISHED, timeout=120)
    assert run["status"] == "succeeded", run
    return run


def instances(user: User, *, all_: bool = False) -> list[dict[str, Any]]:
    query = "?all=1" if all_ else ""
    return user.api("GET", f"/api/v1/workspaces/{user.workspace}/instances/{query}").json()


def ended(user: User, name: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [i for i in instances(user, all_=True) if i["name"] == name]
        if found and found[0]["status"] == "terminated":
            return found[0]
        time.sleep(0.3)
    raise AssertionError(f"instance {name} did not end in {timeout}s: {instances(user, all_=True)}")


def on_a_terminal(user: User, cwd: Path, *args: str) -> tuple[int, str, str]:
    """`trainyard ARGS` with stderr on a terminal (a pty) and stdout piped:
    exit code, stdout, and what the terminal showed (ANSI codes removed)."""
    env = {
        **os.environ,
        "TRAINYARD_URL": user.stack.url,
        "TRAINYARD_TOKEN": user.token,
        "HOME": str(cwd.parent),
        "COLUMNS": "120",
        "TERM": "xterm-256color",
    }
    main, terminal = pty.openpty()
    shown: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the other side closed
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process = subprocess.Popen(
            [str(TRAINYARD), *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=terminal
        )
        os.close(terminal)
        stdout, _ = process.communicate(timeout=120)
        reader.join(10)
    finally:
        os.close(main)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(shown).decode(errors="replace"))
    return process.returncode, stdout.decode(), text


def test_downloads_run_at_once_pick_files_by_path_and_continue_a_cut_off_file(jade: User, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "shards-repo")
    (repo / ".trainyard" / "workflows.yaml").write_text(SHARDS)
    commit_all(repo, "shards")
    name = run_name_of(jade.cli(repo, "run", "shards", "-d"))
    finished(jade, name)
    manifest = {
        f"{a['path'].removeprefix('./')}/{f['path']}": f
        for a in jade.api("GET", f"/api/v1/workspaces/{jade.workspace}/runs/{name}/artifacts/").json()
        for f in a["files"]
    }
    assert sorted(manifest) == ["notes/readme.txt", "shards/part-0.bin", "shards/part-1.bin", "shards/part-2.bin"]

    everything = jade.cli(tmp_path, "artifacts", "download", name, "-o", "full", "-j", "3")
    assert everything.returncode == 0, everything.stderr
    assert everything.stderr.splitlines()[-1] == f"Downloaded 4 files ({size(9 * MIB + 22)}) to full"
    for path, entry in manifest.items():
        assert hashlib.sha256((tmp_path / "full" / path).read_bytes()).hexdigest() == entry["sha256"], path

    picked = jade.cli(
        tmp_path, "artifacts", "download", name, "-o", "picked", "--path", "shards/part-1*", "--path", "notes"
    )
    assert picked.returncode == 0, picked.stderr
    written = sorted(
        p.relative_to(tmp_path / "picked").as_posix() for p in (tmp_path / "picked").rglob("*") if p.is_file()
    )
    assert written == ["notes/readme.txt", "shards/part-1.bin"]
    nothing = jade.cli(tmp_path, "artifacts", "download", name, "-o", "none", "--path", "model/*")
    assert (nothing.returncode, nothing.stderr) == (1, f"error: no file of run {name}'s artifacts matches model/*\n")

    # A download cut off after 1 MiB left its part: the next one asks for the rest only.
    whole = (tmp_path / "full" / "shards" / "part-0.bin").read_bytes()
    part = tmp_path / "again" / "shards" / "part-0.bin.trainyard-part"
    part.parent.mkdir(parents=True)
    part.write_bytes(whole[:MIB])
    resumed = jade.cli(tmp_path, "artifacts", "download", name, "-o", "again", "--path", "shards/part-0.bin")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == f"again/shards/part-0.bin  {size(3 * MIB)}  (continued after {size(MIB)})\n"
    assert (tmp_path / "again" / "shards" / "part-0.bin").read_bytes() == whole and not part.exists()
    kept = jade.cli(tmp_path, "artifacts", "download", name, "-o", "again", "--path", "shards/part-0.bin")
    assert kept.stdout == f"again/shards/part-0.bin  {size(3 * MIB)}  (already here)\n"

    # A part that is not the file's start: the whole file's sha256 says so, and the part is dropped.
    (tmp_path / "again" / "shards" / "part-1.bin.trainyard-part").write_bytes(b"\0" * MIB)
    spoiled = jade.cli(tmp_path, "artifacts", "download", name, "-o", "again", "--path", "shards/part-1.bin")
    assert spoiled.returncode == 1
    assert (
        f"but the manifest says {3 * MIB} bytes with sha256 {manifest['shards/part-1.bin']['sha256']}" in spoiled.stderr
    )
    assert not (tmp_path / "again" / "shards" / "part-1.bin.trainyard-part").exists()
    retried = jade.cli(tmp_path, "artifacts", "download", name, "-o", "again", "--path", "shards/part-1.bin")
    assert retried.stdout == f"again/shards/part-1.bin  {size(3 * MIB)}\n", retried.stderr

    # On a terminal the bars show on stderr (bytes of all the files, and each one's); stdout is the same lines.
    code, out, terminal = on_a_terminal(jade, tmp_path, "artifacts", "download", name, "-o", "tty", "--path", "shards")
    assert code == 0, terminal
    assert sorted(out.splitlines()) == [f"tty/shards/part-{i}.bin  {size(3 * MIB)}" for i in range(3)]
    assert re.search(r"3 files .*9\.4/9\.4 MB", terminal), terminal
    assert terminal.rstrip().endswith("Downloaded 3 files (9.0 MiB) to tty"), terminal


def test_a_code_upload_shows_its_progress_on_a_terminal(jade: User, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "tiny-train")
    code, out, terminal = on_a_terminal(jade, repo, "run", "hello", "-d", "--upload")
    assert code == 0, terminal
    assert re.search(r"Uploading code .*kB", terminal), terminal
    finished(jade, run_name_of(subprocess.CompletedProcess([], 0, out, "")))


def test_an_admin_terminates_the_idle_machine_a_run_left_from_the_cli(jade: User, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "tiny-train")
    name = run_name_of(jade.cli(repo, "run", "hello", "-d"))
    finished(jade, name)
    idle = [i for i in instances(jade) if i["status"] == "idle"]
    assert idle, instances(jade)
    machine = idle[0]["name"]

    asked = jade.cli(repo, "instances", "terminate", machine, input="y\n")

    assert asked.returncode == 0, asked.stderr
    assert asked.stderr == (
        f"Terminate instance {machine}? [y/N]: Instance {machine} is terminating: the backend is terminating it.\n"
    )
    gone = ended(jade, machine)
    assert gone["status_reason"] == "the backend confirmed"
    listed = jade.cli(repo, "instances")
    assert machine not in listed.stdout
    again = jade.cli(repo, "instances", "terminate", "-y", machine)
    assert (again.returncode, again.stderr) == (1, f"error: {machine} is already terminated.\n")


def test_the_instances_page_terminates_a_machine_after_its_confirmation(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    page, kurt = signed_in(browser, contexts, stack, stack_github, KURT, "machines")
    repo = make_repo(tmp_path / "tiny-train")
    finished(kurt, run_name_of(kurt.cli(repo, "run", "hello", "-d")))
    machine = next(i["name"] for i in instances(kurt) if i["status"] == "idle")

    nav_to(page, "Runners & instances")
    row = page.get_by_role("row").filter(has_text=machine)
    expect(row.get_by_role("cell", name=machine, exact=True)).to_be_visible()
    audit(page)
    row.get_by_role("button", name="Terminate", exact=True).click()
    confirm = row.get_by_role("button", name="Terminate now")
    expect(confirm).to_be_focused()
    audit(page)
    screenshot(page, "instances-terminate-confirm")
    assert [i["status"] for i in instances(kurt) if i["name"] == machine] == ["idle"]  # nothing before the confirmation
    confirm.click()

    expect(page.get_by_text(f"{machine} is terminating: the backend is terminating it.")).to_be_visible()
    ended(kurt, machine)
    audit(page)

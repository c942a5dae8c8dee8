"""Every install line Trainyard prints works as printed: the README, docs/,
the dashboard's pages and the CLI's messages are read for ``pip install``
lines naming a Trainyard distribution; each must install from a server's own
wheels (the names are not published yet: docs/CLI.md, "Installing"), and
each, with the running stack as the server, installs into a fresh virtualenv
a CLI that talks to that server, or a runner that starts.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import User
from tests.support.stack import REPO_ROOT, Stack

# Where a line is printed for a user to copy.
PRINTED = [
    REPO_ROOT / "README.md",
    *sorted((REPO_ROOT / "docs").rglob("*.md")),
    *sorted(p for p in (REPO_ROOT / "frontend" / "src").rglob("*.ts*") if "test" not in p.parts),
    *sorted((REPO_ROOT / "cli" / "trainyard").rglob("*.py")),
]
# A `pip install` of a Trainyard distribution, up to the end of the line, code span or string.
INSTALL = re.compile(r"pip install [^\n`\"'<]*?(?<=\s)trainyard(?:-(?:cli|runner|spec))?(?=$|[\s`\"'<)])")
# The one shape they must have: the server's folder of the distribution's wheels.
SHAPE = re.compile(r"^pip install --extra-index-url (\S+)/(cli|runner)/wheels/ trainyard-(cli|runner)$")
# What stands for the server in a printed line: a placeholder, the docs' example host, the page's origin.
SERVER = re.compile(r"^(<server>|https?://trainyard\.example\.com|\$\{\w+\}|\$TRAINYARD_URL)$")
# Decisions record history; they print nothing for a user to copy.
HISTORY = REPO_ROOT / "docs" / "decisions"


def printed_install_lines() -> dict[str, list[str]]:
    """Each install line as printed, and where (file:line)."""
    found: dict[str, list[str]] = {}
    for path in PRINTED:
        if HISTORY in path.parents:
            continue
        for number, text in enumerate(path.read_text().splitlines(), 1):
            for line in INSTALL.findall(text):
                found.setdefault(line.strip(), []).append(f"{path.relative_to(REPO_ROOT)}:{number}")
    return found


def test_every_printed_install_line_names_the_servers_wheels() -> None:
    found = printed_install_lines()
    # The README, docs/CLI.md and the dashboard print them.
    places = {p.split(":")[0] for where in found.values() for p in where}
    assert {"README.md", "docs/CLI.md", "frontend/src/lib/install.ts"} <= places, found
    assert any(SHAPE.match(line) and SHAPE.match(line)[3] == "cli" for line in found), found
    assert any(SHAPE.match(line) and SHAPE.match(line)[3] == "runner" for line in found), found
    for line, where in found.items():
        shape = SHAPE.match(line)
        assert shape, f"{where}: {line!r} does not install from the server's wheels (pip would fail or take PyPI's)"
        assert shape[2] == shape[3], f"{where}: {line!r} looks for trainyard-{shape[3]} in /{shape[2]}/wheels/"
        assert SERVER.match(shape[1]), f"{where}: {line!r}: {shape[1]!r} is no placeholder for the server"


@pytest.fixture(scope="module")
def ike(stack: Stack) -> User:
    return User("ike", stack.issue_token("ike"), stack)


def _fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True)
    return path / "bin"


def _the_command(dist: str, stack: Stack) -> list[str]:
    """The one command every printed line of trainyard-``dist`` is, with this server in it."""
    commands = {
        tuple(shlex.split(line.replace(shape[1], stack.url, 1)))
        for line in printed_install_lines()
        if (shape := SHAPE.match(line)) and shape[3] == dist
    }
    assert len(commands) == 1, commands
    return list(commands.pop())


def _install(argv: list[str], bin: Path, home: Path) -> None:
    # The venv's own pip, with the machine's pip configuration (its package index stands for PyPI).
    done = subprocess.run(
        [str(bin / "pip"), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=900,
        env={"PATH": f"{bin}:/usr/bin:/bin", "HOME": str(home)},
    )
    assert done.returncode == 0, f"{shlex.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


@pytest.mark.timeout(900)  # pip resolves the CLI's dependencies from the package index
def test_the_printed_cli_line_installs_a_cli_that_talks_to_the_server(stack: Stack, ike: User, tmp_path: Path) -> None:
    bin = _fresh_venv(tmp_path / "venv")
    _install(_the_command("cli", stack), bin, tmp_path)

    version = subprocess.run([str(bin / "trainyard"), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip() == "trainyard, version 0.1.0", version
    listed = subprocess.run([str(bin / "pip"), "list", "--format=freeze"], capture_output=True, text=True).stdout
    assert re.search(r"^trainyard-cli==0\.1\.0\+g[0-9a-f]{10}$", listed, re.M), listed
    assert re.search(r"^trainyard-spec==0\.1\.0\+g[0-9a-f]{10}$", listed, re.M), listed

    # The installed CLI reads the server as ike.
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": f"{bin}:/usr/bin:/bin", "HOME": str(tmp_path)}
    env["TRAINYARD_URL"], env["TRAINYARD_TOKEN"] = stack.url, ike.token
    runs = subprocess.run([str(bin / "trainyard"), "ps"], cwd=work, capture_output=True, text=True, env=env)
    assert runs.returncode == 0 and "Traceback" not in runs.stderr, runs.stderr


@pytest.mark.timeout(1500)  # the server makes the runner's wheels for three Pythons and two CPUs first
def test_the_printed_runner_line_installs_a_runner_that_starts(stack: Stack, tmp_path: Path) -> None:
    # A server makes the runner's wheels on the first request, which takes minutes (pip would time
    # out): an operator makes them ahead with `manage.py runner_wheels` (docs/RUNNER.md), this does it here.
    with urllib.request.urlopen(f"{stack.url}/runner/wheels/", timeout=900) as page:
        assert page.status == 200
    bin = _fresh_venv(tmp_path / "venv")
    _install(_the_command("runner", stack), bin, tmp_path)

    shown = subprocess.run([str(bin / "trainyard-runner"), "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "--power-off-after" in shown.stdout, shown
    listed = subprocess.run([str(bin / "pip"), "list", "--format=freeze"], capture_output=True, text=True).stdout
    assert re.search(r"^trainyard-runner==0\.1\.0\+g[0-9a-f]{10}$", listed, re.M), listed

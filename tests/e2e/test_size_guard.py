"""The size guard of `trainyard run` against the real server: over the soft
limit it lists the largest files and asks (in a terminal) or warns and goes
on (no terminal, --yes); over the server's TRAINYARD_MAX_BLOB_BYTES it refuses
before a byte is uploaded."""

from __future__ import annotations

import os
import pty
import re
import subprocess
from pathlib import Path

import pytest

from backend.artifacts.models import Blob
from backend.runs.models import Run
from tests.e2e.conftest import TRAINYARD, User, make_repo, run_name_of
from tests.support.fixtures import Person, owner, team  # noqa: F401 - the hard limit's own server and tenant
from tests.support.web import WebServers

SOFT = {"TRAINYARD_CODE_WARN_SIZE": "1MiB"}
WARNING = (
    "warning: this run uploads 3.0 MiB of uncommitted and untracked files beyond the commit, "
    "more than 1.0 MiB (TRAINYARD_CODE_WARN_SIZE or --code-warn-size):\n"
    "  3.0 MiB  data/train.bin\n"
    "      6 B  notes.txt\n"
    "Leave untracked files out by listing them in .trainyardignore at the top of the repo (gitignore syntax), "
    "e.g. `echo '/data/train.bin' >> .trainyardignore`\n"
)
QUESTION = "Upload 3.0 MiB with this run? [y/N]: "


def with_big_data(repo: Path, megabytes: float) -> Path:
    (repo / "data").mkdir()
    (repo / "data" / "train.bin").write_bytes(os.urandom(int(megabytes * 2**20)))
    (repo / "notes.txt").write_text("small\n")
    return repo


def blob_count(user: User) -> int:
    code = "from backend.artifacts.models import Blob; print(Blob.objects.count())"
    return int(user.stack.manage("shell", "-c", code).strip().splitlines()[-1])


def in_terminal(user: User, cwd: Path, *args: str, answer: str) -> subprocess.CompletedProcess[str]:
    """`trainyard ARGS` with a terminal on stdin, where ``answer`` is typed."""
    env = {
        **os.environ,
        **SOFT,
        "TRAINYARD_URL": user.stack.url,
        "TRAINYARD_TOKEN": user.token,
        "HOME": str(cwd.parent),
    }
    main, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [str(TRAINYARD), *args],
            cwd=cwd,
            env=env,
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(terminal)
        os.write(main, answer.encode())  # the terminal holds the line until the CLI reads it
        stdout, stderr = process.communicate(timeout=120)
    finally:
        os.close(main)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


# ---------------------------------------------------------------- the soft limit


def test_without_a_terminal_the_run_warns_with_the_largest_files_and_goes_on(alice: User, repo: Path) -> None:
    with_big_data(repo, 3)
    result = alice.cli(repo, "run", "hello", "-d", env=SOFT)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(WARNING)
    assert alice.run(run_name_of(result))["code"]["has_patch"] is True


def test_in_a_terminal_no_uploads_nothing_and_submits_nothing(alice: User, repo: Path) -> None:
    with_big_data(repo, 3)
    runs, blobs = len(alice.runs()), blob_count(alice)

    result = in_terminal(alice, repo, "run", "hello", "-d", answer="n\n")

    assert result.returncode == 1
    assert (
        result.stderr
        == WARNING + QUESTION + "error: nothing was uploaded and no run was submitted (--yes uploads without asking)\n"
    )
    assert (len(alice.runs()), blob_count(alice)) == (runs, blobs)


def test_in_a_terminal_yes_uploads_and_submits(alice: User, repo: Path) -> None:
    with_big_data(repo, 3)
    result = in_terminal(alice, repo, "run", "hello", "-d", answer="y\n")
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(WARNING + QUESTION + "Run ")
    assert alice.run(run_name_of(result))["code"]["has_patch"] is True


def test_the_yes_option_does_not_ask_and_the_ignore_file_silences_the_warning(alice: User, repo: Path) -> None:
    with_big_data(repo, 3)
    asked = in_terminal(alice, repo, "run", "hello", "-d", "--yes", answer="")
    (repo / ".trainyardignore").write_text("/data/train.bin\n")
    ignored = in_terminal(alice, repo, "run", "hello", "-d", answer="")

    assert asked.returncode == 0 and asked.stderr.startswith(WARNING + "Run "), asked.stderr
    assert ignored.returncode == 0 and ignored.stderr.startswith("Run "), ignored.stderr


def test_a_bad_soft_limit_is_named_with_what_to_write(alice: User, repo: Path) -> None:
    from_env = alice.cli(repo, "run", "hello", "-d", env={"TRAINYARD_CODE_WARN_SIZE": "lots"})
    from_option = alice.cli(repo, "run", "hello", "-d", "--code-warn-size", "20 parsecs")
    assert (from_env.returncode, from_env.stderr) == (
        1,
        "error: TRAINYARD_CODE_WARN_SIZE: 'lots' is not a size: write bytes, or a number with KB, MB, GB, KiB, MiB "
        "or GiB (20MiB); fix or unset it\n",
    )
    assert from_option.returncode == 2
    assert "Invalid value for --code-warn-size: '20 parsecs' is not a size" in from_option.stderr


# ---------------------------------------------------------------- the hard limit: the server's own


@pytest.fixture
def small_server(web_server: WebServers, owner: Person) -> tuple[str, Person]:  # noqa: F811
    """The real ASGI server accepting blobs of at most 1 MiB, and its tenant's admin."""
    return web_server.start(TRAINYARD_MAX_BLOB_BYTES=str(2**20)).url, owner


def cli_of(server: tuple[str, Person], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    url, person = server
    env = {**os.environ, "TRAINYARD_URL": url, "TRAINYARD_TOKEN": person.token, "TRAINYARD_WORKSPACE": "acme"}
    env["HOME"] = str(cwd.parent)
    return subprocess.run(
        [str(TRAINYARD), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["patch", "--upload"])
def test_over_the_servers_limit_the_run_is_refused_before_anything_is_uploaded(
    small_server: tuple[str, Person], tmp_path: Path, how: str
) -> None:
    repo = with_big_data(make_repo(tmp_path / "tiny-train"), 2)
    result = cli_of(small_server, repo, "run", "hello", "-d", *(["--upload"] if how == "--upload" else []))

    what = {
        "patch": "2.0 MiB of uncommitted and untracked files beyond the commit",
        "--upload": "2.0 MiB of files in its archive of the working tree",
    }[how]
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"error: this run would upload {what}, more than the server accepts (1.0 MiB, its TRAINYARD_MAX_BLOB_BYTES); "
        "nothing was uploaded\n  2.0 MiB  data/train.bin\n"
    )
    assert "echo '/data/train.bin' >> .trainyardignore" in result.stderr
    assert (Blob.objects.count(), Run.objects.count()) == (0, 0)


@pytest.mark.django_db(transaction=True)
def test_a_patch_that_grows_past_the_servers_limit_is_refused_before_it_is_uploaded(
    small_server: tuple[str, Person], tmp_path: Path
) -> None:
    # 0.9 MiB of random bytes: under the limit as files, over it as a binary patch (base85).
    repo = with_big_data(make_repo(tmp_path / "tiny-train"), 0.9)
    result = cli_of(small_server, repo, "run", "hello", "-d")
    assert result.returncode == 1
    first = result.stderr.splitlines()[0]
    assert re.fullmatch(
        r"error: this run's patch of 921\.6 KiB of uncommitted and untracked files beyond the commit is 1\.\d MiB, "
        r"more than the server accepts \(1\.0 MiB, its TRAINYARD_MAX_BLOB_BYTES\); nothing was uploaded",
        first,
    ), result.stderr
    assert (Blob.objects.count(), Run.objects.count()) == (0, 0)


@pytest.mark.django_db(transaction=True)
def test_under_the_servers_limit_the_run_is_submitted(small_server: tuple[str, Person], tmp_path: Path) -> None:
    repo = with_big_data(make_repo(tmp_path / "tiny-train"), 0.25)
    result = cli_of(small_server, repo, "run", "hello", "-d")
    assert result.returncode == 0, result.stderr
    assert (Blob.objects.count(), Run.objects.get().name) == (1, run_name_of(result))

"""End-to-end fixtures: a tiny-train git repo and the real `trainyard` CLI.

Every test here drives the real stack (web, Celery worker and beat, local
runner processes, Postgres, Redis) through the CLI and the REST API.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext

from tests.support.aws_account import prepare
from tests.support.chromium import chromium
from tests.support.moto import MotoServer
from tests.support.stack import Stack

TINY_TRAIN = Path(__file__).resolve().parents[3] / "shared" / "examples" / "tiny-train"
TRAINYARD = Path(sys.executable).parent / "trainyard"
FINISHED = {"succeeded", "failed", "stopped"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/e2e/ starts the whole stack: mark it slow."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_repo(path: Path, *, remote: bool = True) -> Path:
    """A copy of shared/examples/tiny-train as a git repo; with a bare
    ``origin`` the runner can clone from (a local path is a git URL too)."""
    if not TINY_TRAIN.is_dir():
        raise RuntimeError(f"the example repo is missing: {TINY_TRAIN} (shared/ must sit beside the repo)")
    shutil.copytree(TINY_TRAIN, path)
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    git(path, "init", "-q", "-b", "main")
    git(path, "-c", "user.email=t@example.com", "-c", "user.name=T", "add", "-A")
    git(path, "-c", "user.email=t@example.com", "-c", "user.name=T", "commit", "-qm", "init")
    if remote:
        origin = path.parent / f"{path.name}-origin.git"
        git(path.parent, "clone", "-q", "--bare", str(path), str(origin))
        git(path, "remote", "add", "origin", str(origin))
        git(path, "fetch", "-q", "origin")
    return path


def commit_all(path: Path, message: str) -> None:
    git(path, "-c", "user.email=t@example.com", "-c", "user.name=T", "add", "-A")
    git(path, "-c", "user.email=t@example.com", "-c", "user.name=T", "commit", "-qm", message)
    if git(path, "remote").strip():
        git(path, "push", "-q", "origin", "HEAD:main")


@dataclass
class User:
    name: str
    token: str
    stack: Stack

    @property
    def workspace(self) -> str:
        return self.api("GET", "/api/v1/me/").json()["default_workspace"]

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.request(method, f"{self.stack.url}{path}", headers=headers, timeout=30, **kwargs)

    def run(self, name: str) -> dict[str, Any]:
        response = self.api("GET", f"/api/v1/workspaces/{self.workspace}/runs/{name}/")
        response.raise_for_status()
        return response.json()

    def runs(self) -> list[dict[str, Any]]:
        return self.api("GET", f"/api/v1/workspaces/{self.workspace}/runs/?page_size=500").json()["results"]

    def wait(self, name: str, until: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        run = self.run(name)
        while not until(run):
            if time.monotonic() > deadline:
                raise AssertionError(f"run {name} did not reach the expected state in {timeout}s: {run}")
            time.sleep(0.2)
            run = self.run(name)
        return run

    def cli(
        self,
        cwd: Path,
        *args: str,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {
            **os.environ,
            "TRAINYARD_URL": self.stack.url,
            "TRAINYARD_TOKEN": self.token,
            "HOME": str(cwd.parent),  # no login file from the developer's home
            **(env or {}),
        }
        return subprocess.run(
            [str(TRAINYARD), *args],
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )


@pytest.fixture(autouse=True)
def _scratch_open_to_jobs(tmp_path: Path) -> None:
    """A test's scratch folder is where it and its jobs exchange marks (a
    control file a job waits for, a marker a job appends to). The local
    backend's root runners run each job as a user of its own (docs/RUNNER.md,
    "The job's user"), so the folder is open to every user (1777) and
    reachable from /."""
    from trainyard_runner.jobuser import isolating, make_reachable

    if isolating():
        tmp_path.chmod(0o1777)
        make_reachable(tmp_path)


@pytest.fixture(scope="session")
def alice(stack: Stack) -> User:
    return User("alice", stack.issue_token("alice"), stack)


@pytest.fixture(scope="session")
def bob(stack: Stack) -> User:
    return User("bob", stack.issue_token("bob"), stack)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium for a module's browser tests (each test opens its own contexts)."""
    with chromium() as launched:
        yield launched


@pytest.fixture
def contexts(browser: Browser) -> Iterator[list[BrowserContext]]:
    """Browser profiles a test opens (``browser.new_context()``, appended here): closed after it."""
    opened: list[BrowserContext] = []
    yield opened
    for context in opened:
        context.close()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "tiny-train")


def run_name_of(result: subprocess.CompletedProcess[str]) -> str:
    """`trainyard run -d` prints the run's name as its last line of output."""
    lines = result.stdout.strip().splitlines()
    assert lines, f"no output: stderr={result.stderr}"
    return lines[-1].strip()


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# One of moto's built-in images (root device /dev/sda1): the AMI the e2e AWS accounts use.
MOTO_AMI = "ami-03cf127a"


def connect_aws(user: User, repo: Path, aws: MotoServer, *, bucket: str) -> None:
    """``user``'s workspace connects moto's account through the CLI (keys; the
    checks run for real), with a default VPC routed out and ``bucket``."""
    prepare(aws, regions=["us-east-1"], bucket=bucket)
    connected = user.cli(
        repo,
        *("backend", "add", "aws", "--access-key-id", "testing", "--secret-access-key", "testing"),
        *("--regions", "us-east-1", "--bucket", bucket, "--ami", f"us-east-1={MOTO_AMI}"),
    )
    assert connected.returncode == 0, connected.stderr + connected.stdout

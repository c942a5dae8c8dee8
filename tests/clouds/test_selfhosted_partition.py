"""A self-hosted runner cut off from the server stops its job once the
unreachable grace has passed (runner/trainyard_runner/serverwatch.py), so
the server's retry elsewhere is the only copy; a workflow that says
``on_server_lost: keep-running`` keeps running. A real web server (uvicorn),
a real registered runner process and a real job; the partition is the
server going away under the runner's open connection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from tests.e2e.conftest import TRAINYARD, make_repo
from tests.support.fixtures import Person
from tests.support.web import WebServer, WebServers

pytestmark = pytest.mark.django_db(transaction=True)

GRACE = 4
DECLARED = {"cpus": 64, "memory_bytes": 256 * 2**30, "disk_bytes": 500 * 2**30, "gpus": []}
SLEEPER = """workflows:
  - name: sleeper
    provider: bash
    commands:
      - echo $$ > {pid_file}
      - exec sleep 600
    resources:
      cpu: 64
{extra}"""


class Runner:
    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.log = work_dir / "runner.log"
        self.process: subprocess.Popen[bytes] | None = None

    def register(self, url: str, token: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "trainyard_runner", "register", "--url", url, "--token", token,
             "--work-dir", str(self.work_dir), "--name", "lab-box"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_RUNNER", "TRAINYARD_SERVER"))}
        env["TRAINYARD_RUNNER_RESOURCES"] = json.dumps(DECLARED)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trainyard_runner", "--work-dir", str(self.work_dir)],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    made = Runner(tmp_path / "machine")
    yield made
    made.kill()


def _until(check: object, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.2)


def _job_running(server: WebServer, owner: Person, runner: Runner, tmp_path: Path, extra: str = "") -> psutil.Process:
    """Register and start the runner, submit the sleeper with the CLI; returns the job's process."""
    made = httpx.post(
        f"{server.url}/api/v1/workspaces/acme/runners/registration-tokens/",
        headers={"Authorization": f"Bearer {owner.token}"},
        json={"note": "lab"},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    runner.register(server.url, made.json()["token"])
    runner.start()
    _until(lambda: Instance.objects.filter(status=InstanceStatus.IDLE).exists(), "the runner's hello", 60)
    drop = tmp_path / "drop"  # the job runs as a user of its own (docs/RUNNER.md): a folder it may write to
    drop.mkdir()
    drop.chmod(0o1777)
    pid_file = drop / "job.pid"
    repo = make_repo(tmp_path / "repo")
    (repo / ".trainyard" / "workflows.yaml").write_text(SLEEPER.format(pid_file=pid_file, extra=extra))
    env = {**os.environ, "TRAINYARD_URL": server.url, "TRAINYARD_TOKEN": owner.token, "TRAINYARD_WORKSPACE": "acme"}
    env["HOME"] = str(tmp_path)  # no login file from the developer's home
    submitted = subprocess.run(
        [str(TRAINYARD), "run", "-d", "sleeper"], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    )
    assert submitted.returncode == 0, submitted.stderr
    try:
        _until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the job's start", 120)
    except AssertionError as e:
        raise AssertionError(f"{e}\nrunner log:\n{runner.text()[-3000:]}\nweb log:\n{server.log()[-3000:]}") from None
    job = psutil.Process(int(pid_file.read_text()))
    assert job.is_running()
    return job


def test_a_partitioned_self_hosted_runner_stops_its_job_after_the_grace(
    team: Workspace, owner: Person, web_server: WebServers, runner: Runner, tmp_path: Path
) -> None:
    server = web_server.start(TRAINYARD_UNREACHABLE_GRACE_SECONDS=str(GRACE))
    job = _job_running(server, owner, runner, tmp_path)

    server.kill()  # the runner's connection and every reconnection fail from now on
    lost_at = time.monotonic()

    _until(lambda: not job.is_running() or job.status() == psutil.STATUS_ZOMBIE, "the job's end", GRACE + 40)
    assert time.monotonic() - lost_at >= GRACE - 1, "stopped before the grace was over"
    assert "the runner lost the server for" in runner.text()
    assert runner.process is not None and runner.process.poll() is None, "the runner itself keeps trying"


def test_a_job_of_a_workflow_that_keeps_running_outlives_the_grace(
    team: Workspace, owner: Person, web_server: WebServers, runner: Runner, tmp_path: Path
) -> None:
    server = web_server.start(TRAINYARD_UNREACHABLE_GRACE_SECONDS=str(GRACE))
    job = _job_running(server, owner, runner, tmp_path, extra="    on_server_lost: keep-running\n")

    server.kill()
    time.sleep(GRACE + 8)

    try:
        assert job.is_running() and job.status() != psutil.STATUS_ZOMBIE
        assert "the runner lost the server for" not in runner.text()
    finally:
        job.kill()

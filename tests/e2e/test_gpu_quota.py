"""A member's GPU quota end to end: two registered runners with one
(stand-in, tests/support/gpus.py) GPU each, the real scheduler. With a quota
of 1 GPU, the member's second GPU job waits, saying why, while the second
runner stays idle, and starts once the first job ends (docs/COST.md,
"Budgets and quotas"). The quota is set through the budgets' API, as an
admin would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import User, commit_all, make_repo, run_name_of
from tests.support.gpus import gpu, stand_in_nvidia_smi
from tests.support.stack import Stack
from tests.support.waiting import wait_for

WORKFLOW = """
  - name: gpu-step
    provider: bash
    backends: [self-hosted]
    resources: {gpu: 1}
    commands:
      - echo "holding the GPU"
      - until [ -e "$END" ]; do sleep 0.2; done
      - echo "done with the GPU"
"""
WAITING = "waiting for GPU quota: mabel's 1 GPU is in use (quota 1, this job needs 1)"


@pytest.fixture(scope="module")
def mabel(stack: Stack) -> User:
    return User("mabel", stack.issue_token("mabel"), stack)


class _Runner:
    """A registered runner whose PATH starts with a stand-in ``nvidia-smi`` of one GPU."""

    def __init__(self, user: User, root: Path, name: str) -> None:
        self.work_dir, self.bin_dir, self.name = root / name, root / f"{name}-bin", name
        stand_in_nvidia_smi(self.bin_dir, [gpu(util=50)])
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_RUNNER", "TRAINYARD_SERVER"))}
        self.env["PATH"] = f"{self.bin_dir}{os.pathsep}{self.env.get('PATH', '')}"
        made = user.api(
            "POST", f"/api/v1/workspaces/{user.workspace}/runners/registration-tokens/", json={"note": name}
        )
        assert made.status_code == 201, made.text
        registered = subprocess.run(
            [sys.executable, "-m", "trainyard_runner", "register", "--url", user.stack.url,
             "--token", made.json()["token"], "--work-dir", str(self.work_dir), "--name", name],
            capture_output=True, text=True, timeout=60, env=self.env,
        )  # fmt: skip
        assert registered.returncode == 0, registered.stderr
        with open(root / f"{name}.log", "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trainyard_runner", "--work-dir", str(self.work_dir)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def runners(mabel: User, tmp_path: Path) -> Iterator[list[_Runner]]:
    started = [_Runner(mabel, tmp_path, f"gpu-box-{n}") for n in (1, 2)]
    yield started
    for runner in started:
        runner.stop()
    ws = mabel.workspace
    for runner in mabel.api("GET", f"/api/v1/workspaces/{ws}/runners/").json():
        mabel.api("POST", f"/api/v1/workspaces/{ws}/runners/{runner['id']}/revoke/")
    mabel.stack.manage(
        "shell",
        "-c",
        f"from backend.billing.models import Budget; Budget.objects.filter(workspace__slug={ws!r}).delete()",
    )
    # Nothing of ours runs: the runners are gone, and no job process of theirs outlived them.
    assert all(r.process.poll() is not None for r in started)
    assert not _job_processes(tmp_path), _job_processes(tmp_path)


def _job_processes(root: Path) -> list[int]:
    """Processes whose working directory is under one of this test's runners' work dirs."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(root) in os.readlink(proc / "cwd"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def _runners(user: User) -> dict[str, str]:
    """Each runner's status by name."""
    listed = user.api("GET", f"/api/v1/workspaces/{user.workspace}/runners/").json()
    return {r["name"]: r["status"] for r in listed}


def test_a_members_next_gpu_job_waits_for_their_quota_and_starts_when_the_first_ends(
    mabel: User, runners: list[_Runner], tmp_path: Path
) -> None:
    both_idle = {"gpu-box-1": "idle", "gpu-box-2": "idle"}
    wait_for("both runners to be idle", lambda: _runners(mabel) == both_idle, 60, explain=lambda: _runners(mabel))
    quota = mabel.api(
        "PUT", f"/api/v1/workspaces/{mabel.workspace}/budgets/mabel/", json={"monthly_limit": None, "gpu_quota": 1}
    )
    assert quota.status_code == 200, quota.text
    repo = make_repo(tmp_path / "tiny-train")
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + WORKFLOW)
    commit_all(repo, "a GPU job that holds its GPU until told")
    first_end, second_end = tmp_path / "first.end", tmp_path / "second.end"
    second_end.touch()  # the second job ends as soon as it starts

    first = run_name_of(mabel.cli(repo, "run", "gpu-step", "-d", "-e", f"END={first_end}"))
    mabel.wait(first, lambda r: r["status"] == "running" and r["jobs"][0]["status"] == "running", timeout=60)
    second = run_name_of(mabel.cli(repo, "run", "gpu-step", "-d", "-e", f"END={second_end}"))
    waiting = wait_for(
        "the second job to wait for the quota",
        lambda: (j := mabel.run(second)["jobs"][0])["status_reason"] == WAITING and j,
        30,
        explain=lambda: mabel.run(second)["jobs"][0]["status_reason"],
    )
    assert waiting["status"] == "pending" and waiting["attempts"] == []
    # Not for want of a machine: the other runner, and its GPU, stay idle.
    assert sorted(_runners(mabel).values()) == ["busy", "idle"], _runners(mabel)

    first_end.touch()
    done = mabel.wait(first, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=60)
    assert done["status"] == "succeeded", done
    ended = mabel.wait(second, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=60)
    assert ended["status"] == "succeeded", ended
    [attempt] = ended["jobs"][0]["attempts"]
    assert attempt["started_at"] >= done["jobs"][0]["finished_at"]

"""The guards end to end (docs/WORKFLOWS.md, "Guards"): real runners, the
real beat. ``stall`` with ``action: restart`` ends tiny-train's attempt that
stops printing, and the next attempt resumes from the checkpoint the runner
synced as it stopped; ``utilization_policy`` stops a job whose (stand-in)
GPUs stay idle, on a registered runner whose PATH has the stand-in
``nvidia-smi`` (tests/support/gpus.py). Both reasons are shown by
``trainyard show`` and the API."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import User, commit_all, make_repo, run_name_of
from tests.support.gpus import gpu, stand_in_nvidia_smi
from tests.support.stack import Stack

STALLS = """
  - name: stalls
    provider: bash
    deps: [{workflow: download-base-model}]
    checkpoint: ./checkpoint
    env: {STEP_SECONDS: "0.05"}
    commands:
      - STEPS=3 python train.py
      - if [ "$TRAINYARD_ATTEMPT" = 1 ]; then echo "hanging without a word"; sleep 600; fi
      - STEPS=6 python train.py
    metrics: [{name: loss, regex: 'step (?P<step>\\d+)/\\d+ loss (?P<value>[0-9.]+)'}]
    stall: {timeout: 4s, action: restart}
"""
IDLE = """
  - name: idle-gpus
    provider: bash
    backends: [self-hosted]
    resources: {gpu: 1}
    commands:
      - echo "loading the data onto the GPU"
      - while true; do echo still here; sleep 1; done
    metrics: {interval: 1s}
    utilization_policy: {min_gpu_utilization: 10, time_window: 6s}
"""


@pytest.fixture(scope="module")
def gideon(stack: Stack) -> User:
    return User("gideon", stack.issue_token("gideon"), stack)


def _repo(tmp_path: Path, extra: str) -> Path:
    repo = make_repo(tmp_path / "tiny-train")
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + extra)
    commit_all(repo, "guards")
    return repo


def test_a_job_that_stops_printing_is_restarted_and_resumes_from_its_checkpoint(gideon: User, tmp_path: Path) -> None:
    repo = _repo(tmp_path, STALLS)
    plan = gideon.cli(repo, "run", "stalls", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "guard: stall: restarted from its last checkpoint after 4s without output" in plan.stdout

    name = run_name_of(gideon.cli(repo, "run", "stalls", "-d", "--backend", "local"))
    run = gideon.wait(name, lambda r: r["status"] in {"succeeded", "failed", "stopped"}, timeout=180)

    assert run["status"] == "succeeded", run
    job = next(j for j in run["jobs"] if j["name"] == "stalls")
    first, second = job["attempts"]
    assert (first["reason"], second["reason"]) == ("stalled", "done")
    assert first["message"].startswith("stalled: no log line and no metric value for ")
    assert first["message"].endswith("(stall timeout 4s); restarting it from its last checkpoint")
    assert second["restored_checkpoint"] is not None
    assert job["placement"]["stall"] == {"timeout": 4, "action": "restart"}

    log = gideon.cli(repo, "logs", name)
    assert log.returncode == 0, log.stderr
    text = log.stdout
    assert "hanging without a word" in text
    # Attempt 2 starts from step 3 (the checkpoint synced when attempt 1 was
    # stopped) and trains on to 6: steps 1 to 3 ran once.
    assert "resuming from step 3" in text
    assert [int(n) for n in re.findall(r"step (\d)/6 loss", text)] == [4, 5, 6]
    assert len(re.findall(r"step [123]/3 loss", text)) == 3
    assert "resumed=1" in text

    shown = gideon.cli(repo, "show", name)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"stalls\s+1\s.*stalled: no log line", shown.stdout), shown.stdout
    assert "stalls: stall: restarted from its last checkpoint after 4s without output" in shown.stdout


BAD = """
  - name: bad-metrics
    provider: bash
    commands: [python train.py]
    metrics:
      - {name: cpu, regex: 'cpu ([0-9.]+)'}
      - {name: loss, regex: 'loss [0-9.]+'}
      - {name: acc, regex: 'acc=([0-9.]+'}
"""


def test_bad_metric_patterns_are_refused_at_submission_with_file_line_and_key(gideon: User, tmp_path: Path) -> None:
    repo = _repo(tmp_path, BAD)
    result = gideon.cli(repo, "run", "bad-metrics", "-d")
    assert result.returncode != 0
    lines = (repo / ".trainyard" / "workflows.yaml").read_text().splitlines()
    cpu = lines.index("      - {name: cpu, regex: 'cpu ([0-9.]+)'}") + 1  # the next two items follow it
    where = ".trainyard/workflows.yaml:{}: workflows[6] (bad-metrics).metrics[{}]"
    assert f"{where.format(cpu, 0)}.name: 'cpu' is a system metric's name" in result.stderr, result.stderr
    assert f"{where.format(cpu + 1, 1)}.regex: the regex has no group for the value" in result.stderr
    assert (
        f"{where.format(cpu + 2, 2)}.regex: the regex does not compile: missing ), unterminated subpattern"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not [r for r in gideon.runs() if r["workflow"] == "bad-metrics"]


class _Machine:
    """A registered runner whose PATH starts with the stand-in ``nvidia-smi``."""

    def __init__(self, work_dir: Path, bin_dir: Path) -> None:
        self.work_dir, self.bin_dir = work_dir, bin_dir
        self.log = work_dir / "runner.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_RUNNER", "TRAINYARD_SERVER"))}
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trainyard_runner", "--work-dir", str(self.work_dir)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def gpu_machine(gideon: User, tmp_path: Path) -> Iterator[_Machine]:
    bin_dir = tmp_path / "bin"
    stand_in_nvidia_smi(bin_dir, [gpu(util=2), gpu(util=0)])
    machine = _Machine(tmp_path / "machine", bin_dir)
    ws = gideon.workspace
    made = gideon.api("POST", f"/api/v1/workspaces/{ws}/runners/registration-tokens/", json={"note": "gpu box"})
    assert made.status_code == 201, made.text
    registered = subprocess.run(
        [sys.executable, "-m", "trainyard_runner", "register", "--url", gideon.stack.url,
         "--token", made.json()["token"], "--work-dir", str(machine.work_dir), "--name", "gpu-box"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip
    assert registered.returncode == 0, registered.stderr
    machine.start()
    yield machine
    machine.stop()
    for runner in gideon.api("GET", f"/api/v1/workspaces/{ws}/runners/").json():
        gideon.api("POST", f"/api/v1/workspaces/{ws}/runners/{runner['id']}/revoke/")


def test_a_job_whose_gpus_stay_idle_is_stopped_low_gpu_utilization(
    gideon: User, tmp_path: Path, gpu_machine: _Machine
) -> None:
    repo = _repo(tmp_path, IDLE)
    name = run_name_of(gideon.cli(repo, "run", "idle-gpus", "-d"))
    run = gideon.wait(name, lambda r: r["status"] in {"succeeded", "failed", "stopped"}, timeout=120)

    assert run["status"] == "failed", run
    [job] = run["jobs"]
    [attempt] = job["attempts"]
    assert attempt["instance"] == "gpu-box"
    assert attempt["reason"] == "low_gpu_utilization"
    assert attempt["message"] == "every GPU stayed below 10% for 6s (the highest was 2%; utilization_policy)"
    log = gideon.cli(repo, "logs", name)
    assert "still here" in log.stdout  # it printed all along: only its GPUs were idle

    shown = gideon.cli(repo, "show", name)
    assert re.search(r"idle-gpus\s+1\s.*low_gpu_utilization: every GPU stayed below 10%", shown.stdout), shown.stdout
    metrics = gideon.api("GET", f"/api/v1/workspaces/{gideon.workspace}/runs/{name}/metrics/").json()
    [listed] = metrics["jobs"]
    assert {"gpu0.util", "gpu1.util"} <= set(listed["system"])
    assert listed["attempts"][0]["termination_reason"] == "low_gpu_utilization"
    assert json.dumps(metrics)  # the API answers with the reason too

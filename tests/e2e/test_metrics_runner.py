"""A job's system samples, end to end: a real local runner samples the job
(and a stand-in ``nvidia-smi``'s GPUs, NVML being absent here), the real
server stores its Metrics frames, and the samples read back through the
metrics API (docs/METRICS.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import User, commit_all, run_name_of
from tests.support.burn import BURN, assert_cpu_is_what_the_job_got
from tests.support.gpus import gpu, stand_in_nvidia_smi
from tests.support.stack import Stack

WORKFLOWS = """workflows:
  - name: burn
    provider: bash
    commands:
      - python burn.py
"""
SECONDS_TO_BURN = 16


@pytest.fixture(scope="module")
def rowan(stack: Stack) -> User:
    return User("rowan", stack.issue_token("rowan"), stack)


@pytest.fixture(scope="module")
def ruthie(stack: Stack) -> User:
    return User("ruthie", stack.issue_token("ruthie"), stack)


def _burn(user: User, repo: Path) -> tuple[str, dict[str, Any]]:
    """Run the burner to its end; its run's name and its job."""
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    (repo / "burn.py").write_text(BURN)
    commit_all(repo, "burn")
    name = run_name_of(user.cli(repo, "run", "burn", "-d", "-e", f"SECONDS_TO_BURN={SECONDS_TO_BURN}"))
    run = user.wait(name, lambda r: r["status"] in ("succeeded", "failed", "stopped"), timeout=120)
    assert run["status"] == "succeeded", run
    return name, run["jobs"][0]


def _stored(user: User, run: str, job: str) -> dict[str, Any]:
    """What the server stored of the job's metrics, through the API: every
    sample (its time and each system series' value at it) in time order, and
    the job's series names and counters."""
    base = f"/api/v1/workspaces/{user.workspace}/runs/{run}/metrics/"
    summary = next(j for j in user.api("GET", base).json()["jobs"] if j["job"] == job)
    answer = user.api("GET", base + "series/", params={"job": job, "points": 5000})
    assert answer.status_code == 200, answer.text
    by_time: dict[float, dict[str, Any]] = {}
    for series in answer.json()["series"]:
        if series["kind"] != "system":
            continue
        assert series["resolution"] == "raw", series
        for t, y in zip(series["points"]["x"], series["points"]["y"], strict=True):
            by_time.setdefault(t, {"t": t})[series["name"]] = y
    return {**summary, "samples": [by_time[t] for t in sorted(by_time)]}


def _lines(user: User, repo: Path, run: str) -> list[str]:
    logs = user.cli(repo, "logs", run)
    assert logs.returncode == 0, logs.stderr
    return logs.stdout.splitlines()


def test_a_job_burning_a_core_shows_its_cpu_rising_memory_and_two_stand_in_gpus(
    rowan: User, stack: Stack, repo: Path, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "gpu-bin"
    stand_in_nvidia_smi(bin_dir, [gpu(util=93, mem_used_mib=7000), gpu(util=41, mem_used_mib=3000)])
    # The local backend's runners get the worker's PATH: a runner started now finds the stand-in.
    with stack.env_changed({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, restart=["worker"]):
        name, job = _burn(rowan, repo)
    stored = _stored(rowan, name, job["name"])
    samples = stored["samples"]
    assert len(samples) >= 3, samples  # every 5 s over 16 s
    assert_cpu_is_what_the_job_got(samples, _lines(rowan, repo, name))
    memory = [s["memory"] for s in samples]
    assert memory[-1] >= memory[0] + (64 << 20), memory  # 8 MiB more every half second
    for sample in samples:
        assert (sample["gpu0.util"], sample["gpu1.util"]) == (93, 41)
        assert (sample["gpu0.memory"], sample["gpu1.memory"]) == (7000 << 20, 3000 << 20)
        assert sample["gpu0.memory_total"] == 23028 << 20
    assert {"cpu", "memory", "gpu0.util", "gpu1.util", "gpu0.memory", "gpu1.memory"} <= set(stored["system"])
    assert stored["training"] == ["acc"] and stored["malformed"] == 1  # from $TRAINYARD_METRICS_FILE


def test_without_a_gpu_the_job_has_no_gpu_series_and_no_error(ruthie: User, repo: Path) -> None:
    name, job = _burn(ruthie, repo)
    stored = _stored(ruthie, name, job["name"])
    assert stored["samples"] and all(s["cpu"] >= 0 for s in stored["samples"])
    assert not [n for n in stored["system"] if n.startswith("gpu")], stored["system"]
    assert all(not any(k.startswith("gpu") for k in s) for s in stored["samples"])
    assert not [line for line in _lines(ruthie, repo, name) if "nvidia" in line.lower() or "Traceback" in line]

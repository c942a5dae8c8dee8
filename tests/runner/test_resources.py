"""``TRAINYARD_RUNNER_RESOURCES`` replaces detection, so a fake machine shape reaches Hello."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trainyard_runner.protocol import Gpu, Resources
from trainyard_runner.resources import RESOURCES_VAR, detect_resources

SHAPE = {
    "cpus": 96,
    "memory_bytes": 768 * 2**30,
    "disk_bytes": 2 * 2**40,
    "gpus": [{"name": "A100", "memory_bytes": 40 * 2**30}] * 2,
}


def test_a_declared_shape_is_reported_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RESOURCES_VAR, json.dumps(SHAPE))

    resources = detect_resources(tmp_path, gpus=[Gpu(name="ignored", memory_bytes=1)])

    assert resources == Resources.model_validate(SHAPE)


def test_without_the_variable_the_host_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RESOURCES_VAR, raising=False)

    resources = detect_resources(tmp_path, gpus=[])

    assert (resources.cpus, resources.gpus) == (os.cpu_count(), [])


def test_the_runner_refuses_to_start_with_an_invalid_shape(tmp_path: Path) -> None:
    env = {RESOURCES_VAR: '{"cpus": 0}', "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "trainyard_runner", "--server", "ws://127.0.0.1:9", "--token", "t"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert result.returncode == 2
    assert f"{RESOURCES_VAR} is not valid Resources JSON" in result.stderr


def test_a_stand_in_nvidia_smi_on_the_path_is_what_the_runner_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.gpus import gpu, stand_in_nvidia_smi

    stand_in_nvidia_smi(tmp_path / "bin", [gpu("NVIDIA H100 80GB HBM3", mem_total_mib=81559), gpu()])
    monkeypatch.delenv(RESOURCES_VAR, raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")

    resources = detect_resources(tmp_path)

    assert resources.gpus == [
        Gpu(name="NVIDIA H100 80GB HBM3", memory_bytes=81559 * 2**20),
        Gpu(name="NVIDIA A10G", memory_bytes=23028 * 2**20),
    ]

"""The docker provider: the engine check and the ``docker run`` command line.
This machine has a docker client but no engine, so only the no-engine path
runs for real."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest
from trainyard_runner import docker
from trainyard_runner.process import script


def test_the_run_command_mounts_the_work_dir_and_passes_the_env_by_file(tmp_path: Path) -> None:
    argv = docker.run_argv(
        job="j-1",
        work=tmp_path / "work",
        env_file=tmp_path / "tmp" / "docker.env",
        image="pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
        script=script(["pip install -r requirements.txt", "python train.py"]),
    )
    assert argv == [
        "docker", "run", "--rm", "--network", "host", "--name", "trainyard-j-1",
        "-v", f"{tmp_path}/work:/workdir", "-w", "/workdir",
        "--env-file", f"{tmp_path}/tmp/docker.env",
        "--", "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
        "bash", "-c", "set -e\npip install -r requirements.txt\npython train.py\n",
    ]  # fmt: skip


def test_the_env_file_is_private_and_multiline_values_go_through_the_client_env(tmp_path: Path) -> None:
    env = {"STEPS": "20", "EMPTY": "", "SPACES": " a b ", "KEY": "-----BEGIN\nabc\n-----END", "PYTHONUNBUFFERED": "1"}
    path = tmp_path / "docker.env"
    pass_env = docker.write_env_file(path, env)
    assert pass_env == ["KEY"]
    assert path.read_text() == "STEPS=20\nEMPTY=\nSPACES= a b \nPYTHONUNBUFFERED=1\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    argv = docker.run_argv(job="j", work=tmp_path, env_file=path, image="img", script="true", pass_env=pass_env)
    assert argv[argv.index("--env-file") + 2 : argv.index("img")] == ["-e", "KEY", "--"]
    client = docker.client_env(env, pass_env)
    assert client["KEY"] == env["KEY"] and "STEPS" not in client


def test_the_client_env_has_no_runner_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_RUNNER_TOKEN", "secret")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nowhere.sock")
    env = docker.client_env({}, [])
    assert "TRAINYARD_RUNNER_TOKEN" not in env and env["DOCKER_HOST"] == "unix:///nowhere.sock"


def test_no_engine_is_reported_with_the_first_line_of_docker_info_stderr() -> None:
    with pytest.raises(docker.DockerError) as e:
        asyncio.run(docker.check_engine())
    reason = str(e.value)
    assert reason.startswith(
        "the docker provider needs a Docker engine on the runner's machine; `docker info` failed: "
    ), reason
    assert "\n" not in reason and len(reason) > len(docker.NO_ENGINE)


def test_a_missing_docker_binary_is_reported_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(docker.DockerError) as e:
        asyncio.run(docker.check_engine())
    assert str(e.value) == docker.NO_ENGINE + "cannot run docker: No such file or directory"


@pytest.mark.parametrize(
    "image",
    ["python:3.11-slim", "ghcr.io/org/team/train:v1.2", "localhost:5000/x", "img@sha256:" + "a" * 64, "a__b/c-d"],
)
def test_image_references_are_accepted(image: str) -> None:
    assert docker.checked_image(image) == image


@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "img --privileged", "Upper/Case", "", "img:"])
def test_an_image_that_is_not_a_reference_never_reaches_docker_as_a_flag(tmp_path: Path, image: str) -> None:
    with pytest.raises(docker.DockerError, match="is not a docker image reference"):
        docker.run_argv(job="j", work=tmp_path, env_file=tmp_path / "e", image=image, script="true")

"""The ``docker`` provider: the job's commands run in ``AssignJob.image``.

The runner checks for an engine (``docker info``) while preparing, then runs
``docker run --rm --network host --name trainyard-<job> -v <work>:/workdir -w
/workdir -v <interrupt folder>:/run/trainyard:ro -v <metrics folder>:/run/trainyard-metrics
--env-file <file> <image> bash -c <script>`` under the reaper, like
bash for the other providers. The job's environment goes through a 0600 file
(never the command line), deleted when the job's process ends; a value with a
line break, which an env file cannot hold, is passed as ``-e NAME`` with the
value in the docker client's environment instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .process import runner_env

log = logging.getLogger(__name__)

ENGINE_TIMEOUT = 10.0
KILL_TIMEOUT = 30.0
WORKDIR = "/workdir"
INTERRUPT_MOUNT = "/run/trainyard"  # the job's interrupt folder, read-only (docs/RUNNER.md, "Spot interruption")
METRICS_MOUNT = "/run/trainyard-metrics"  # the folder of the job's metrics file (docs/RUNNER.md, "Metrics")
NO_ENGINE = "the docker provider needs a Docker engine on the runner's machine; `docker info` failed: "


class DockerError(Exception):
    """The docker provider cannot run the job; the message says why."""


def container_name(job: str) -> str:
    return f"trainyard-{job}"


async def check_engine() -> str:
    """The engine's version; raises ``DockerError`` when there is no engine."""
    code, out, err = await _docker("info", "--format", "{{.ServerVersion}}", timeout=ENGINE_TIMEOUT)
    if code != 0:
        first = next((line.strip() for line in err.splitlines() if line.strip()), f"exit code {code}")
        raise DockerError(NO_ENGINE + first)
    return out.strip()


def run_argv(
    *,
    job: str,
    work: Path,
    env_file: Path,
    image: str,
    script: str,
    pass_env: Sequence[str] = (),
    interrupt_dir: Path | None = None,
    metrics_dir: Path | None = None,
) -> list[str]:
    """The ``docker run`` command line of a job (``pass_env``: names given as
    ``-e NAME``, their values taken from the client's environment;
    ``interrupt_dir``: the folder of the job's interrupt file, mounted
    read-only at ``INTERRUPT_MOUNT``; ``metrics_dir``: the folder of its
    metrics file, at ``METRICS_MOUNT``)."""
    argv = ["docker", "run", "--rm", "--network", "host", "--name", container_name(job)]
    argv += ["-v", f"{work}:{WORKDIR}", "-w", WORKDIR]
    if interrupt_dir is not None:
        argv += ["-v", f"{interrupt_dir}:{INTERRUPT_MOUNT}:ro"]
    if metrics_dir is not None:
        argv += ["-v", f"{metrics_dir}:{METRICS_MOUNT}"]
    argv += ["--env-file", str(env_file)]
    for name in pass_env:
        argv += ["-e", name]
    return [*argv, "--", checked_image(image), "bash", "-c", script]


# An image reference as docker reads it: [host[:port]/]name[/name…][:tag][@digest],
# lower-case names; never something that starts with "-" (an option).
_IMAGE = re.compile(
    r"(?:[a-zA-Z0-9][a-zA-Z0-9.-]*(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[a-z0-9]+:[a-f0-9]{32,})?"
)


def checked_image(image: str) -> str:
    """``image`` if it is an image reference; raises ``DockerError`` saying
    why not (``--privileged`` would otherwise reach ``docker run`` as a flag)."""
    if not _IMAGE.fullmatch(image):
        raise DockerError(
            f"{image!r} is not a docker image reference such as pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"
        )
    return image


def write_env_file(path: Path, env: Mapping[str, str]) -> list[str]:
    """Write ``NAME=value`` lines to ``path`` (created 0600); returns the names
    whose values an env file cannot hold (line breaks, NUL)."""
    lines, rest = [], []
    for name, value in env.items():
        if any(c in value for c in "\n\r\0"):
            rest.append(name)
        else:
            lines.append(f"{name}={value}\n")
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return rest


def client_env(env: Mapping[str, str], pass_env: Sequence[str]) -> dict[str, str]:
    """The docker client's environment: the runner's (DOCKER_HOST and
    friends, no runner token) plus the values passed with ``-e NAME``."""
    return {**runner_env(), **{name: env[name] for name in pass_env}}


async def remove_container(job: str) -> None:
    """Remove a container left by an earlier attempt of the same job (the
    name would clash); quiet when there is none."""
    await _docker("rm", "-f", container_name(job), timeout=KILL_TIMEOUT)


async def kill_container(job: str) -> None:
    code, _, err = await _docker("kill", container_name(job), timeout=KILL_TIMEOUT)
    if code != 0 and "No such container" not in err and "is not running" not in err:
        log.warning("docker kill %s: %s", container_name(job), err.strip()[:500])


async def _docker(*args: str, timeout: float) -> tuple[int, str, str]:
    """Run the docker client; (exit code, stdout, stderr). A missing binary or
    a timeout come back as exit code 127 / 124 with a message on stderr."""
    try:
        proc = await asyncio.create_subprocess_exec(
            "docker",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=runner_env(),
        )
    except OSError as e:
        return 127, "", f"cannot run docker: {e.strerror or e}"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        return 124, "", f"docker {args[0]} timed out after {timeout:.0f}s"
    finally:
        if proc.returncode is None:  # timed out or cancelled
            proc.kill()
            await asyncio.shield(proc.wait())
    return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

"""The ``local`` backend: runner processes on the server's own host.

For the embedded default and tests. Each instance is one ``trainyard-runner``
process in its own session, with a pidfile under
``$TRAINYARD_DATA_DIR/local-runners/`` so the supervisor can kill runners a
crashed server left behind.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from trainyard_runner.resources import detect_resources

from backend.clouds.backends.base import Backend, BackendError, Capacity, Requirements, fits
from backend.clouds.models import Instance

# The server's own configuration and credentials, *_FILE variants included.
SERVER_ONLY_PREFIXES = ("DATABASE_", "REDIS_", "DJANGO_", "TRAINYARD_SECRET", "CELERY_", "AWS_", "GITHUB_")


class LocalBackend(Backend):
    kind = "local"

    def unsatisfiable_reason(self, req: Requirements) -> str | None:
        shortfall = fits(req, host_capacity())
        return f"the local backend cannot run this: {shortfall}" if shortfall else None

    def provision(self, *, instance: Instance, runner_token: str) -> str:
        folder = runners_dir()
        folder.mkdir(parents=True, exist_ok=True)
        work_dir = folder / str(instance.pk)
        env = {
            **os.environ,
            "TRAINYARD_SERVER_URL": ws_url(settings.PUBLIC_URL),
            "TRAINYARD_RUNNER_TOKEN": runner_token,
            "TRAINYARD_RUNNER_DIR": str(work_dir),
            "TRAINYARD_RUNNER_ADDRESS": "127.0.0.1",
        }
        for key in [k for k in env if k.startswith(SERVER_ONLY_PREFIXES)]:
            del env[key]  # a runner (and so every job) has no business with the server's secrets
        try:
            with open(folder / f"{instance.pk}.log", "ab") as log:
                proc = subprocess.Popen(
                    runner_command(),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            raise BackendError(f"cannot start trainyard-runner: {exc}", retryable=False) from exc
        (folder / f"{instance.pk}.pid").write_text(str(proc.pid))
        return str(proc.pid)

    def terminate(self, *, instance: Instance) -> None:
        pidfile = runners_dir() / f"{instance.pk}.pid"
        pid = int(instance.backend_id) if instance.backend_id.isdigit() else None
        if pid is not None and _is_runner(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        pidfile.unlink(missing_ok=True)


@lru_cache(maxsize=1)
def host_capacity() -> Capacity:
    """This host's resources, probed once per process (nvidia-smi is slow)."""
    res = detect_resources(Path(settings.DATA_DIR))
    return Capacity(cpus=res.cpus, memory_bytes=res.memory_bytes, gpus=[g.model_dump() for g in res.gpus])


def runners_dir() -> Path:
    return Path(settings.DATA_DIR) / "local-runners"


def runner_command() -> list[str]:
    custom = settings.TRAINYARD["LOCAL_RUNNER_COMMAND"]
    return shlex.split(custom) if custom else [sys.executable, "-m", "trainyard_runner"]


def ws_url(http_url: str) -> str:
    if http_url.startswith("https://"):
        return "wss://" + http_url.removeprefix("https://")
    return "ws://" + http_url.removeprefix("http://")


def _is_runner(pid: int) -> bool:
    """pids are reused: only signal a process that is still our runner."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"trainyard_runner" in cmdline or b"trainyard-runner" in cmdline

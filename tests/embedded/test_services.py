"""The embedded servers survive a SIGKILLed owner and the next start cleans up.

Runs ``python -m backend.embedded services`` on a tmp data dir (never under
/root: pgserver makes the data dir's parents world-readable).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from backend.embedded.services import REPO_ROOT

pytestmark = pytest.mark.slow

START_TIMEOUT_SECONDS = 90


def test_restart_after_sigkill_reuses_data_and_clean_stop_leaves_nothing(tmp_path: Path, free_port: int) -> None:
    data_dir = tmp_path / "data"
    first = _services_start(data_dir, free_port, tmp_path / "first.out")
    urls = _env_file(data_dir)
    _redis(urls).rpush("queue", "message-1")
    first.kill()
    first.wait()
    assert _processes_in(data_dir), "Postgres / Valkey should outlive a SIGKILLed owner: nothing to clean up"

    second = _services_start(data_dir, free_port, tmp_path / "second.out")

    with psycopg.connect(_env_file(data_dir)["DATABASE_URL"], connect_timeout=5) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("trainyard",)
    assert _redis(_env_file(data_dir)).lrange("queue", 0, -1) == [b"message-1"]
    assert len(_valkey_servers(data_dir)) == 1
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=60) == 0
    assert _processes_in(data_dir) == []
    assert not (data_dir / "embedded.env").exists()


def test_a_second_owner_of_the_same_data_dir_is_refused(tmp_path: Path, free_port: int) -> None:
    data_dir = tmp_path / "data"
    first = _services_start(data_dir, free_port, tmp_path / "first.out")
    try:
        second = subprocess.run(
            [sys.executable, "-m", "backend.embedded", "services"],
            cwd=REPO_ROOT,
            env=_env(data_dir, free_port),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert f"{data_dir} is in use by another Trainyard process (pid {first.pid})" in second.stdout
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    assert _processes_in(data_dir) == []


def _services_start(data_dir: Path, port: int, out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "backend.embedded", "services"],
            cwd=REPO_ROOT,
            env=_env(data_dir, port),
            stdout=stdout,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while b"export REDIS_URL=" not in out.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"services did not start (exit {process.poll()}):\n{out.read_text()}")
        time.sleep(0.1)
    return process


def _env(data_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return {**env, "TRAINYARD_DATA_DIR": str(data_dir), "TRAINYARD_VALKEY_PORT": str(port)}


def _env_file(data_dir: Path) -> dict[str, str]:
    lines = (data_dir / "embedded.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line)


def _redis(urls: dict[str, str]) -> redis.Redis:
    return redis.Redis.from_url(urls["REDIS_URL"], socket_timeout=5)


def _processes_in(data_dir: Path) -> list[str]:
    """Live processes working in, or naming, ``data_dir`` (Postgres chdirs to its data dir)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(data_dir) in cmdline or (proc.info["cwd"] or "").startswith(str(data_dir)):
            found.append(f"{proc.pid} {cmdline}")
    return found


def _valkey_servers(data_dir: Path) -> list[str]:
    return [line for line in _processes_in(data_dir) if "valkey-server" in line]

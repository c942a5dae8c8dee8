"""``python -m backend.embedded run`` end to end: banner, crash of a child, crash of itself.

Needs the Django backend (migrate, ensure_admin, issue_token, the health view).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from backend.embedded.services import REPO_ROOT

pytestmark = pytest.mark.slow

BANNER_TIMEOUT_SECONDS = 120


def test_a_dead_worker_stops_everything_with_exit_code_1(tmp_path: Path, free_port: int) -> None:
    data_dir, web_port = tmp_path / "data", _other_free_port(free_port)
    supervisor, out = _run(data_dir, free_port, web_port, tmp_path / "run.out")
    banner = _wait_for_banner(supervisor, out)
    token = re.search(r"export TRAINYARD_TOKEN=(\S+)", banner).group(1)  # type: ignore[union-attr]
    me = httpx.get(f"http://127.0.0.1:{web_port}/api/v1/me/", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 200

    _child(supervisor, "worker").kill()

    assert supervisor.wait(timeout=60) == 1
    assert "worker exited unexpectedly with code -9" in out.read_text()
    assert _leftovers(data_dir, web_port) == []


def test_after_a_sigkilled_supervisor_the_next_run_starts_and_stops_cleanly(tmp_path: Path, free_port: int) -> None:
    data_dir, web_port = tmp_path / "data", _other_free_port(free_port)
    first, out = _run(data_dir, free_port, web_port, tmp_path / "first.out")
    first_token = _token(_wait_for_banner(first, out))

    first.kill()
    first.wait()
    second, out = _run(data_dir, free_port, web_port, tmp_path / "second.out")
    second_token = _token(_wait_for_banner(second, out))

    assert httpx.get(f"http://127.0.0.1:{web_port}/api/v1/health/").status_code == 200
    # The same admin token on every start (kept in the data dir), not a new one each time.
    assert second_token == first_token and first_token.startswith("trainyard_")
    second.send_signal(signal.SIGINT)
    assert second.wait(timeout=60) == 0
    assert _leftovers(data_dir, web_port) == []


def test_a_restart_keeps_runs_logs_and_artifacts(tmp_path: Path, free_port: int) -> None:
    data_dir, web_port = tmp_path / "data", _other_free_port(free_port)
    repo = _tiny_train(tmp_path / "tiny-train")
    first, out = _run(data_dir, free_port, web_port, tmp_path / "first.out")
    token = re.search(r"export TRAINYARD_TOKEN=(\S+)", _wait_for_banner(first, out)).group(1)  # type: ignore[union-attr]
    cli = _cli(repo, web_port, token)
    assert cli("run", "hello").returncode == 0
    assert cli("run", "download-base-model").returncode == 0
    runs_before = json.loads(cli("ps", "--json").stdout)
    logs_before = {r["name"]: cli("logs", r["name"]).stdout for r in runs_before}

    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=60) == 0
    assert _leftovers(data_dir, web_port) == []
    assert list((data_dir / "local-runners").glob("*.pid")) == []
    second, out = _run(data_dir, free_port, web_port, tmp_path / "second.out")
    _wait_for_banner(second, out)
    try:
        runs_after = json.loads(cli("ps", "--json").stdout)
        download = next(r["name"] for r in runs_after if r["workflow"] == "download-base-model")
        fetched = cli("artifacts", "download", download, "-o", str(tmp_path / "out"))

        assert [(r["name"], r["status"]) for r in runs_after] == [(r["name"], r["status"]) for r in runs_before]
        assert {r["name"]: cli("logs", r["name"]).stdout for r in runs_after} == logs_before
        assert "hello from" in logs_before[runs_before[-1]["name"]]
        assert fetched.returncode == 0, fetched.stderr
        assert (tmp_path / "out" / "base_model" / "weights.json").read_text() == '{"w": 0.0, "b": 0.0}'
    finally:
        second.send_signal(signal.SIGINT)
        second.wait(timeout=60)


def _token(banner: str) -> str:
    return re.search(r"export TRAINYARD_TOKEN=(\S+)", banner).group(1)  # type: ignore[union-attr]


def _tiny_train(path: Path) -> Path:
    shutil.copytree(REPO_ROOT.parent / "shared" / "examples" / "tiny-train", path)
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.email=t@e.st", "-c", "user.name=T", "commit", "-qm", "init"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)
    return path


def _cli(repo: Path, web_port: int, token: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    env = {
        **os.environ,
        "TRAINYARD_URL": f"http://127.0.0.1:{web_port}",
        "TRAINYARD_TOKEN": token,
        "HOME": str(repo.parent),
    }
    trainyard = str(Path(sys.executable).parent / "trainyard")
    return lambda *args: subprocess.run(
        [trainyard, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    )


def _run(data_dir: Path, valkey_port: int, web_port: int, out: Path) -> tuple[subprocess.Popen[bytes], Path]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(TRAINYARD_DATA_DIR=str(data_dir), TRAINYARD_VALKEY_PORT=str(valkey_port), TRAINYARD_PORT=str(web_port))
    env.pop("TRAINYARD_PUBLIC_URL", None)
    with open(out, "wb") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "backend.embedded", "run"],
            cwd=REPO_ROOT,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
        )
    return process, out


def _wait_for_banner(process: subprocess.Popen[bytes], out: Path) -> str:
    deadline = time.monotonic() + BANNER_TIMEOUT_SECONDS
    while "export TRAINYARD_TOKEN=" not in (text := out.read_text(errors="replace")):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no banner (exit {process.poll()}):\n{text[-5000:]}")
        time.sleep(0.2)
    return text


def _child(supervisor: subprocess.Popen[bytes], name: str) -> psutil.Process:
    marker = {"web": "uvicorn", "worker": " worker ", "beat": " beat "}[name]
    children = psutil.Process(supervisor.pid).children()
    return next(child for child in children if marker in " ".join(child.cmdline()) + " ")


def _leftovers(data_dir: Path, web_port: int) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        command = " ".join(proc.info["cmdline"] or [])
        in_data_dir = str(data_dir) in command or (proc.info["cwd"] or "").startswith(str(data_dir))
        if in_data_dir or f"--port {web_port}" in command:
            found.append(f"{proc.pid} {command}")
    return found


def _other_free_port(taken: int) -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    return port if port != taken else _other_free_port(taken)

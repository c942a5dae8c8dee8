"""A configuration error at start is its message and a non-zero exit, never a
traceback: from ``manage.py`` (every command) and from ``make run``'s path
(``python -m backend.embedded run``, whose ``manage.py migrate`` step meets it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.core.env import EXIT_CONFIG_ERROR
from backend.embedded.services import REPO_ROOT

# Nowhere: a settings module that loaded by mistake would fail to connect, not touch the test database.
UNREACHABLE = {"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/nothing", "REDIS_URL": "redis://127.0.0.1:1/0"}
SECRET_KEY_IN_PRODUCTION = "DJANGO_SECRET_KEY must be set in production (or DJANGO_SECRET_KEY_FILE)."
GITHUB_WITH_THE_BUILT_IN_KEY = "GitHub sign-in is configured (GITHUB_CLIENT_ID) with the built-in development"

CASES = {
    "production without DJANGO_SECRET_KEY": ({"TRAINYARD_ENV": "production"}, SECRET_KEY_IN_PRODUCTION),
    "a GitHub app without a secret key": (
        {"GITHUB_CLIENT_ID": "Iv1.abc", "GITHUB_CLIENT_SECRET": "shh", "TRAINYARD_GITHUB_ALLOW": "alice"},
        GITHUB_WITH_THE_BUILT_IN_KEY,
    ),
}


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """The test's environment without any setting of the server's, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TRAINYARD_", "GITHUB_"))}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env.update(TRAINYARD_DATA_DIR=str(tmp_path / "data"), **settings)
    return env


def _run(argv: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", [["check"], ["migrate", "--noinput"], ["ensure_admin"]])
@pytest.mark.parametrize("case", list(CASES))
def test_manage_py_prints_a_configuration_error_without_a_traceback(
    command: list[str], case: str, tmp_path: Path
) -> None:
    settings, message = CASES[case]

    result = _run([sys.executable, "manage.py", *command], _env(tmp_path, **UNREACHABLE, **settings))

    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.stderr.startswith(f"Configuration error: {message}")
    assert result.returncode == EXIT_CONFIG_ERROR


@pytest.mark.parametrize("case", list(CASES))
def test_make_runs_path_prints_a_configuration_error_without_a_traceback(case: str, tmp_path: Path) -> None:
    """Servers from the environment (unreachable: nothing gets as far as them); ``migrate`` stops at the settings."""
    settings, message = CASES[case]
    env = _env(tmp_path, **UNREACHABLE, **settings, TRAINYARD_PORT="1")

    result = _run([sys.executable, "-m", "backend.embedded", "run"], env)

    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert f"Configuration error: {message}" in output
    assert "the configuration above is not valid: fix it and start again" in output
    assert "failed with exit code" not in output
    assert result.returncode == EXIT_CONFIG_ERROR


@pytest.mark.slow
def test_make_run_with_embedded_servers_stops_them_after_a_configuration_error(tmp_path: Path, free_port: int) -> None:
    """``make run`` as the issue ran it: embedded Postgres and Valkey start, ``migrate`` meets the error,
    everything stops again."""
    settings, message = CASES["a GitHub app without a secret key"]
    env = _env(tmp_path, **settings, TRAINYARD_VALKEY_PORT=str(free_port), TRAINYARD_PORT="1")

    result = _run([sys.executable, "-m", "backend.embedded", "run"], env, timeout=300)

    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert f"Configuration error: {message}" in output
    assert "stopping embedded Valkey and Postgres" in output
    assert result.returncode == EXIT_CONFIG_ERROR

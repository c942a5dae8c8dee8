"""Local runners left behind are killed by their pidfiles, and only they are."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from backend.clouds.backends.base import AccountConfig, CloudState, LaunchSpec, Requirements
from backend.clouds.backends.local.compute import LocalCompute
from backend.embedded.processes import cmdline, group_members, pid_alive
from backend.embedded.runners import local_runners_kill


@pytest.mark.parametrize("command", ["trainyard-runner", "python -m trainyard_runner"])
def test_kills_the_runners_process_group_and_deletes_the_pidfiles(tmp_path: Path, command: str) -> None:
    runner = _spawn(f"exec -a '{command}' bash -c 'sleep 600 & wait'", shows=command)
    pidfile = _pidfile(tmp_path, "instance-1", runner.pid)

    killed = local_runners_kill(tmp_path)

    assert killed == [runner.pid]
    assert runner.wait(timeout=10) == -15
    assert group_members(runner.pid) == []  # its `sleep` child too
    assert not pidfile.exists()


def test_a_reused_pid_that_is_not_a_runner_is_left_alone(tmp_path: Path) -> None:
    stranger = _spawn("exec sleep 600", shows="sleep 600")
    pidfile = _pidfile(tmp_path, "instance-2", stranger.pid)
    try:
        killed = local_runners_kill(tmp_path)

        assert killed == []
        assert pid_alive(stranger.pid)
        assert not pidfile.exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_a_runner_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    ready = tmp_path / "trap-installed"
    script = f"exec -a trainyard-runner bash -c 'trap \"\" TERM; touch {ready}; while true; do sleep 0.1; done'"
    runner = _spawn(script, shows="trainyard-runner")
    _pidfile(tmp_path, "instance-3", runner.pid)
    deadline = time.monotonic() + 10
    while not ready.exists():  # a SIGTERM before the trap would kill it the ordinary way
        assert time.monotonic() < deadline
        time.sleep(0.01)

    local_runners_kill(tmp_path)

    assert runner.wait(timeout=10) == -9


def test_kills_the_runners_the_local_backend_started_which_it_then_reports_terminated(tmp_path: Path) -> None:
    account = AccountConfig(
        account_id="a",
        workspace_id="w",
        kind="local",
        installation="ty-test",
        config={"runners_dir": str(tmp_path / "local-runners")},
    )
    local = LocalCompute(account)
    spec = LaunchSpec(
        idempotency_key="ty-instance-1", instance_name="local-1", runner_token="t", server_url="http://127.0.0.1:9"
    )
    handle = local.launch(next(iter(local.offers(Requirements()))), spec)

    killed = local_runners_kill(tmp_path)

    assert killed == [int(handle.backend_id)]
    assert not pid_alive(int(handle.backend_id))
    assert local.describe([handle]) == {"ty-instance-1": CloudState.TERMINATED}
    assert local.list_managed() == []
    local.terminate(handle)
    assert local.describe([handle]) == {"ty-instance-1": CloudState.NOT_FOUND}


def _spawn(script: str, *, shows: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    # Until the exec, /proc shows the forked Python's command line.
    deadline = time.monotonic() + 10
    while not cmdline(process.pid).startswith(shows):
        assert time.monotonic() < deadline, f"the test process never showed {shows!r}"
        time.sleep(0.01)
    return process


def _pidfile(data_dir: Path, instance: str, pid: int) -> Path:
    folder = data_dir / "local-runners"
    folder.mkdir(exist_ok=True)
    path = folder / f"{instance}.pid"
    path.write_text(str(pid))
    return path

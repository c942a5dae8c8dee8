"""The local backend beyond the contract: what a runner is started with, the
files it is found by, and the processes it must never mistake for one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.server import ServerConnection, serve

from backend.clouds.backends.base import AccountConfig, CloudState, Handle, LaunchSpec, Requirements
from backend.clouds.backends.errors import InvalidConfig, NotYetTerminated
from backend.clouds.backends.local.compute import LocalCompute
from backend.clouds.backends.local.process import ws_url
from tests.clouds.subjects import SHAPES, LocalSubject, runner_pids, signals_of, states, terminate_fully, wait_for


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalSubject]:
    made = LocalSubject(name="local", root=tmp_path)
    yield made
    left = made.leftovers()
    assert left == [], f"the test left these running: {left}"


class HelloServer:
    """A websocket server that keeps the first frame of each runner and then
    refuses it (close 4403), so the runner exits 2 by itself."""

    def __init__(self) -> None:
        self.hellos: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []  # (path, Authorization)
        self._server = serve(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.socket.getsockname()[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        self.requests.append((ws.request.path, ws.request.headers.get("Authorization", "")))
        self.hellos.append(json.loads(ws.recv(timeout=10)))
        ws.close(4403, "test: seen enough")

    def close(self) -> None:
        self._server.shutdown()


@pytest.fixture
def hello_server() -> Iterator[HelloServer]:
    server = HelloServer()
    yield server
    server.close()


def test_a_runner_on_a_shape_reports_exactly_that_shape(local: LocalSubject, hello_server: HelloServer) -> None:
    local.server_url = hello_server.url
    compute = local.build(shapes=SHAPES)
    gpu = next(o for o in compute.offers(Requirements()) if o.instance_type == "gpu-a100")
    spec = local.spec()

    handle = compute.launch(gpu, spec)

    wait_for(lambda: hello_server.hellos != [], what="the runner's hello")
    shape = SHAPES[2]
    assert hello_server.hellos[0]["resources"] == {k: shape[k] for k in ("cpus", "memory_bytes", "disk_bytes", "gpus")}
    assert hello_server.requests == [("/ws/runner/", f"Bearer {spec.runner_token}")]
    # Refused, the runner exits by itself: its files remain, the process is gone.
    wait_for(lambda: states(compute, handle) == [CloudState.TERMINATED], what="the refused runner to exit")
    assert compute.list_managed() == []
    compute.terminate(handle)
    assert states(compute, handle) == [CloudState.NOT_FOUND]


def test_on_the_host_offer_the_runner_detects_the_host(
    local: LocalSubject, hello_server: HelloServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_RUNNER_RESOURCES", "inherited from the server: must not reach the runner")
    local.server_url = hello_server.url
    compute = local.build()
    [host] = compute.offers(Requirements())

    handle = compute.launch(host, local.spec())

    wait_for(lambda: hello_server.hellos != [], what="the runner's hello")
    assert (host.instance_type, host.region, host.price_per_hour, host.cpus) == ("host", "local", 0.0, os.cpu_count())
    assert hello_server.hellos[0]["resources"]["cpus"] == os.cpu_count()
    assert hello_server.hellos[0]["resources"]["memory_bytes"] == host.memory_bytes
    terminate_fully(compute, handle)


def test_the_runner_gets_its_own_variables_and_none_of_the_servers_secrets(
    local: LocalSubject, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "server-only")
    monkeypatch.setenv("MY_SECRET_TOKEN", "server-only")
    monkeypatch.setenv("KEPT_FOR_JOBS", "yes")
    monkeypatch.setenv("TRAINYARD_RUNNER_TOKEN_FILE", "/server/token")
    compute = local.build(env_strip_prefixes=["MY_SECRET_", "AWS_"])
    spec = local.spec()

    handle = compute.launch(next(iter(compute.offers(Requirements()))), spec)

    env = _environ(int(handle.backend_id))
    assert {k: v for k, v in env.items() if k.startswith("TRAINYARD_RUNNER_") or k == "TRAINYARD_SERVER_URL"} == {
        "TRAINYARD_SERVER_URL": ws_url(local.server_url),
        "TRAINYARD_RUNNER_TOKEN": spec.runner_token,
        "TRAINYARD_RUNNER_DIR": str(local.root / "runners" / spec.idempotency_key),
        "TRAINYARD_RUNNER_ADDRESS": "127.0.0.1",
        "TRAINYARD_RUNNER_JOBS_OUTLIVE": "0",  # a dead local runner is a gone machine: its jobs die with it
        "TRAINYARD_RUNNER_ABSOLUTE_PATHS": "0",  # the server's own host: no job reaches outside its runner
    }
    assert env["HOME"] == str(local.root / "runners" / spec.idempotency_key / "home"), "a home of its own"
    assert env["TRAINYARD_SERVER_URL"].startswith("ws://127.0.0.1:")
    assert ("AWS_SECRET_ACCESS_KEY" in env, "MY_SECRET_TOKEN" in env, env.get("KEPT_FOR_JOBS")) == (False, False, "yes")
    terminate_fully(compute, handle)


def test_by_default_the_servers_own_configuration_is_stripped(
    local: LocalSubject, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "DATABASE_URL",
        "REDIS_URL",
        "DJANGO_SECRET_KEY",
        "TRAINYARD_SECRET_KEYS_FILE",
        "GITHUB_CLIENT_SECRET",
    ):
        monkeypatch.setenv(name, "server-only")
    compute = local.build()

    handle = compute.launch(next(iter(compute.offers(Requirements()))), local.spec())

    leaked = [
        k for k in _environ(int(handle.backend_id)) if k.startswith(("DATABASE_", "REDIS_", "DJANGO_", "GITHUB_"))
    ]
    assert leaked == []
    assert "TRAINYARD_SECRET_KEYS_FILE" not in _environ(int(handle.backend_id))
    terminate_fully(compute, handle)


def test_a_runner_is_found_by_its_files(local: LocalSubject) -> None:
    compute = local.build()
    spec = local.spec()

    handle = compute.launch(next(iter(compute.offers(Requirements()))), spec)

    folder = local.root / "runners"
    record = json.loads((folder / f"{spec.idempotency_key}.json").read_text())
    assert (folder / f"{spec.idempotency_key}.pid").read_text() == f"{handle.backend_id}\n"
    assert (folder / f"{spec.idempotency_key}.log").exists()
    assert record["installation"] == "ty-test"
    assert (record["instance_name"], record["offer_id"]) == (spec.instance_name, "local/local/-/host/on-demand")
    assert time.time() - record["started_at"] < 30
    assert spec.runner_token not in (folder / f"{spec.idempotency_key}.json").read_text()
    assert handle.data == {
        "instance_name": spec.instance_name,
        "instance_type": "host",
        "launched_at": f"{float(record['started_at']):.3f}",  # the leak sweep leaves a young runner alone
    }

    terminate_fully(compute, handle)

    left = {p.name for p in folder.iterdir()}
    assert {f"{spec.idempotency_key}.pid", f"{spec.idempotency_key}.json"} & left == set()
    assert f"{spec.idempotency_key}.log" in left  # kept for whoever wonders what the runner said


def test_a_command_that_cannot_start_is_invalid_config_naming_it(local: LocalSubject) -> None:
    compute = local.build(runner_command=["/nonexistent/trainyard-runner", "--verbose"])
    spec = local.spec()

    with pytest.raises(InvalidConfig) as raised:
        compute.launch(next(iter(compute.offers(Requirements()))), spec)

    assert "cannot start the runner command '/nonexistent/trainyard-runner --verbose'" in raised.value.message
    assert raised.value.code == "RunnerCommandFailed"
    assert states(compute, Handle(key=spec.idempotency_key)) == [CloudState.NOT_FOUND]


def test_a_command_that_does_not_look_like_a_runner_is_refused_and_killed(local: LocalSubject) -> None:
    compute = local.build(runner_command=["sleep", "600"])
    spec = local.spec()

    with pytest.raises(InvalidConfig) as raised:
        compute.launch(next(iter(compute.offers(Requirements()))), spec)

    assert "runs as 'sleep 600', which does not name trainyard-runner or trainyard_runner" in raised.value.message
    wait_for(lambda: runner_pids(local.root) == [], what="the unrecognisable process to die")
    assert states(compute, Handle(key=spec.idempotency_key)) == [CloudState.NOT_FOUND]


def test_a_wrapper_that_execs_the_runner_a_moment_later_is_a_runner(local: LocalSubject) -> None:
    # `sh -c '…; exec trainyard-runner'` shows its own command line until it
    # execs (here one that does not name the runner), and an empty one while
    # it execs: a launch that reads either must not refuse the command.
    compute = local.build(runner_command=["bash", "-c", "sleep 0.3; exec -a trainyard-$(echo runner) sleep 600"])
    spec = local.spec()

    launched = compute.launch(next(iter(compute.offers(Requirements()))), spec)

    assert runner_pids(local.root) == [int(launched.backend_id)]
    terminate_fully(compute, Handle(key=spec.idempotency_key))


def test_a_runner_ignoring_sigterm_is_killed_after_kill_after(local: LocalSubject) -> None:
    compute = local.build(**local.slow_to_stop_config())
    spec = local.spec()
    handle = compute.launch(next(iter(compute.offers(Requirements()))), spec)
    local.settle(handle)
    started = time.monotonic()

    not_yet = terminate_fully(compute, handle)

    assert time.monotonic() - started >= 1.0  # kill_after
    assert not_yet >= 2
    assert runner_pids(local.root) == []


def test_a_reused_pid_is_never_taken_for_a_runner_nor_signalled(local: LocalSubject) -> None:
    compute = local.build()
    stranger = subprocess.Popen(["sleep", "600"])
    folder = local.root / "runners"
    folder.mkdir()
    (folder / "ty-old.pid").write_text(f"{stranger.pid}\n")
    (folder / "ty-old.json").write_text(json.dumps({"installation": "ty-test", "instance_name": "old"}))
    try:
        assert states(compute, Handle(key="ty-old")) == [CloudState.TERMINATED]
        assert compute.list_managed() == []

        compute.terminate(Handle(key="ty-old", backend_id=str(stranger.pid)))

        assert stranger.poll() is None
        assert sorted(p.name for p in folder.glob("ty-old*")) == []
    finally:
        stranger.kill()
        stranger.wait()


def test_a_runner_that_died_is_terminated_and_its_key_can_be_launched_again(local: LocalSubject) -> None:
    compute = local.build()
    spec = local.spec()
    offer = next(iter(compute.offers(Requirements())))
    first = compute.launch(offer, spec)
    os.kill(int(first.backend_id), 9)
    wait_for(lambda: states(compute, first) == [CloudState.TERMINATED], what="the killed runner to be seen gone")

    second = compute.launch(offer, spec)

    assert second.backend_id != first.backend_id
    assert states(compute, second) == [CloudState.RUNNING]
    terminate_fully(compute, second)


def test_a_runner_that_is_up_shuts_down_on_sigterm_while_terminate_says_not_yet(local: LocalSubject) -> None:
    compute = local.build()
    handle = compute.launch(next(iter(compute.offers(Requirements()))), local.spec())
    # Up: its own SIGTERM handler is installed (before that, SIGTERM just ends the process).
    wait_for(lambda: signal.SIGTERM in signals_of(int(handle.backend_id), "SigCgt"), what="the runner's handler")

    with pytest.raises(NotYetTerminated) as raised:
        compute.terminate(handle)

    assert raised.value.retry_after == 1.0
    terminate_fully(compute, handle)
    assert runner_pids(local.root) == []


@pytest.mark.parametrize(
    "req",
    [Requirements(spot_policy="spot"), Requirements(regions=("us-east-1",)), Requirements(max_price=-1.0)],
)
def test_the_local_backend_offers_nothing_outside_its_placement(local: LocalSubject, req: Requirements) -> None:
    assert list(local.build().offers(req)) == []


def test_spot_auto_and_the_local_region_get_the_host(local: LocalSubject) -> None:
    offers = local.build().offers(Requirements(spot_policy="auto", regions=("local",)))

    assert [o.instance_type for o in offers] == ["host"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "the local backend needs config key 'runners_dir'"),
        ({"runners_dir": ""}, "the local backend's config key 'runners_dir' must be a non-empty string, not ''"),
        (
            {"runners_dir": "/tmp/x", "runner_command": "trainyard-runner"},
            "the local backend's config key 'runner_command' must be a list of strings, not 'trainyard-runner'",
        ),
        (
            {"runners_dir": "/tmp/x", "shapes": [{"name": "s", "cpus": "8", "memory_bytes": 1, "disk_bytes": 1}]},
            "the local backend's config key 'shapes[].cpus' must be an integer ≥ 0, not '8'",
        ),
        (
            {"runners_dir": "/tmp/x", "shapes": [{"name": "s", "cpus": 0, "memory_bytes": 1, "disk_bytes": 1}]},
            "the local backend's shapes need distinct names and at least 1 CPU each: ['s']",
        ),
        (
            {"runners_dir": "/tmp/x", "kill_after": "soon"},
            "the local backend's config key 'kill_after' must be a number ≥ 0, not 'soon'",
        ),
    ],
)
def test_bad_config_is_refused_with_what_to_fix(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidConfig) as raised:
        LocalCompute(AccountConfig(account_id="a", workspace_id="w", kind="local", installation="i", config=config))

    assert raised.value.message == message


@pytest.mark.parametrize(
    ("server", "runner"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000"),
        ("https://trainyard.example.com", "wss://trainyard.example.com"),
        ("ws://127.0.0.1:8000", "ws://127.0.0.1:8000"),
    ],
)
def test_the_runner_is_given_the_websocket_url_of_the_server(server: str, runner: str) -> None:
    assert ws_url(server) == runner


def test_a_key_that_is_not_a_safe_file_name_is_refused(local: LocalSubject) -> None:
    compute = local.build()
    spec = LaunchSpec(idempotency_key="../escape", instance_name="x", runner_token="t", server_url=local.server_url)

    with pytest.raises(ValueError) as raised:
        compute.launch(next(iter(compute.offers(Requirements()))), spec)

    assert str(raised.value) == "idempotency key '../escape' is not 1-128 letters, digits, '.', '_' or '-'"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(var.split("=", 1) for var in raw.split("\0") if "=" in var)


def test_stopping_a_machine_kills_what_its_jobs_setsid_out_of_their_process_groups(tmp_path: Path) -> None:
    """Issue 11, item 26: killing a local machine's shims also kills the
    processes its jobs moved out of their groups (found by TRAINYARD_JOB_MARK)."""
    import os
    import subprocess
    import sys

    from trainyard_runner.process import MARK_VAR, SHIM

    from backend.clouds.backends.local.process import kill_shims

    job_dir = tmp_path / "jobs" / "j"
    job_dir.mkdir(parents=True)

    def sleepers() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
                live = (
                    cmdline == b"sleep\x001234.8\x00" and (entry / "stat").read_text().split(")")[-1].split()[0] != "Z"
                )
                if live:
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    script = "setsid sleep 1234.8 & sleep 1000"
    shim = subprocess.Popen(  # as Execution.start starts it, without a runner that would sweep afterwards
        [sys.executable, "-I", "-S", str(SHIM), str(job_dir), "1", "bash", "-c", script],
        env={**os.environ, MARK_VAR: "j.test-mark"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 5
        while not (sleepers() and (job_dir / "shim.json").exists()) and time.monotonic() < deadline:
            time.sleep(0.02)
        escaped = sleepers()

        kill_shims(tmp_path)

        deadline = time.monotonic() + 3
        while sleepers() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(escaped) == 1
        assert sleepers() == []
    finally:
        shim.kill()
        shim.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="a job gets a user of its own only under a root runner")
def test_stopping_a_machine_kills_what_its_jobs_moved_out_of_their_group_and_environment(tmp_path: Path) -> None:
    """A job of a root runner runs as a uid of its own (docs/RUNNER.md, "The
    job's user"): ``setsid env -i`` leaves its group and its mark, not its
    uid, and kill_shims kills every process of the uid its shim.json names."""
    import subprocess
    import sys

    from trainyard_runner import jobuser
    from trainyard_runner.process import MARK_VAR, SHIM, UID_VAR

    from backend.clouds.backends.local.process import kill_shims

    job_dir = tmp_path / "jobs" / "j"
    job_dir.mkdir(parents=True)
    user = jobuser.claim(tmp_path / "uid-locks")
    escaped = b"sleep\x001234.9\x00"

    def sleepers() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                live = entry.name.isdigit() and (entry / "cmdline").read_bytes() == escaped
                if live and (entry / "stat").read_text().split(")")[-1].split()[0] != "Z":
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    shim = subprocess.Popen(  # as Execution.start starts it, without a runner that would sweep afterwards
        [
            sys.executable,
            "-I",
            "-S",
            str(SHIM),
            str(job_dir),
            "1",
            "bash",
            "-c",
            "setsid env -i sleep 1234.9 & sleep 1000",
        ],
        env={**os.environ, MARK_VAR: "j.test-mark", UID_VAR: str(user.uid)},
        cwd="/",
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 5
        while not (sleepers() and (job_dir / "shim.json").exists()) and time.monotonic() < deadline:
            time.sleep(0.02)
        before = sleepers()

        kill_shims(tmp_path)

        deadline = time.monotonic() + 3
        while sleepers() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(before) == 1
        assert sleepers() == []
    finally:
        shim.kill()
        shim.wait()
        user.release()


def test_stopping_a_machine_kills_a_job_that_runs_in_a_standby_shim(tmp_path: Path) -> None:
    """A standby shim's command line names only the jobs directory
    (``_shim.py <work>/jobs/ standby``): kill_shims finds it all the same."""
    import asyncio

    from trainyard_runner.process import ShimStandby

    from backend.clouds.backends.local.process import kill_shims

    job_dir = tmp_path / "jobs" / "j"
    job_dir.mkdir(parents=True)

    async def hand() -> int:
        standby = ShimStandby(tmp_path / "jobs")
        await standby.fill()
        job = {"job_dir": str(job_dir), "outlive": True, "argv": ["sleep", "1234.9"], "cwd": str(tmp_path)}
        proc = await standby.hand({**job, "env": {"PATH": os.environ["PATH"]}})
        assert proc is not None
        return proc.pid

    shim_pid = asyncio.run(hand())
    try:
        deadline = time.monotonic() + 5
        while not (job_dir / "shim.json").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (job_dir / "shim.json").exists()

        assert kill_shims(tmp_path) == [shim_pid]

        deadline = time.monotonic() + 3
        while _running(shim_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _running(shim_pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shim_pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

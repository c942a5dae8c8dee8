"""SSH into a running job (runner/trainyard_runner/sessions/ssh.py) with the
stock OpenSSH client: ``ssh``, ``scp``, ``sftp`` and ``rsync`` reach a real
job of the runner through a bridge standing in for the relay
(tests/support/sshbridge.py). On a root runner (as here in CI) the job runs
as a user of its own, and so does everything a session starts."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest
from trainyard_runner import jobuser
from trainyard_runner.job import Job, Lifecycle, commands_environ
from trainyard_runner.ports import free_ports
from trainyard_runner.protocol import AssignJob, CodeSpec, JobState
from trainyard_runner.sessions.context import SessionContext
from trainyard_runner.sessions.hostkey import load_or_create_host_key
from trainyard_runner.sessions.ssh import MAX_SESSIONS, serve_ssh

from tests.runner.test_agent import DEAD_API
from tests.support.sshbridge import HOST, bridge, client_files, run, ssh_options


@pytest.fixture(autouse=True)
def _stock_clients() -> None:
    missing = [name for name in ("ssh", "scp", "sftp", "ssh-keygen", "rsync") if shutil.which(name) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: install Debian's openssh-client and rsync (make test-packages)")


# What the job's own commands record, to compare with what a session sees.
RECORD = [
    "mkdir .record",
    'python -c "import sys; print(sys.prefix)" > .record/prefix.txt',
    "env -0 > .record/env.bin",
    "touch .record/ready",
    "sleep 600",
]


@contextlib.asynccontextmanager
async def running_job(tmp_path: Path, repo: tuple[Path, str]) -> AsyncIterator[Job]:
    """A real job of the runner, its commands running (``RECORD``); stopped at the end."""
    work = tmp_path / "runner"
    if jobuser.isolating():
        jobuser.prepare_work_dir(work, private=[], shared=[])
    path, commit = repo
    spec = AssignJob(job="j1", attempt=1, seq_base=0, lease="l", lease_seconds=15, run_name="r1", workflow="w",
                     commands=RECORD, env={"TRAINYARD_RUN": "r1", "PORT_0": "8123"}, port_count=1,
                     code=CodeSpec(kind="git", repo_url=str(path), commit=commit), artifacts=[],
                     api_url=DEAD_API)  # fmt: skip

    async def report(_: JobState) -> None:
        pass

    job = Job(spec, work_dir=work, token="tok", report=report, on_logs_ready=lambda: None, on_drain_stuck=lambda: None)
    job.confirm()
    task = asyncio.create_task(job.run())
    server = asyncio.create_task(_store_logs(job))
    try:
        for _ in range(600):
            if job.phase == Lifecycle.RUNNING and (job.dir / "work" / ".record" / "ready").exists():
                break
            assert not task.done(), task.result()
            await asyncio.sleep(0.05)
        yield job
    finally:
        job.cancel("the test ended")
        await asyncio.wait_for(task, 30)
        server.cancel()


async def _store_logs(job: Job) -> None:
    """The server's part for the job's log: every line is acknowledged."""
    while True:
        while job.stream.take_batch() is not None:
            pass
        job.stream.ack(job.stream.last_seq)
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def ssh_to(tmp_path: Path, ctx: SessionContext, *, registered: bool = True) -> AsyncIterator[list[str]]:
    """The options that take the stock client to a session of ``ctx`` as ``HOST``."""
    host_key = load_or_create_host_key(tmp_path / "runner")
    key, known = client_files(tmp_path, host_key)
    keys = [key.with_suffix(".pub").read_text()] if registered else [_other_key()]
    async with bridge(tmp_path / "relay.sock", lambda sock: serve_ssh(sock, ctx, keys, host_key)):
        yield ssh_options(tmp_path / "relay.sock", key, known)


def _other_key() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()


def _env(raw: bytes) -> dict[str, str]:
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


# Set by the shell or by SSH itself, not by the job.
SESSION_VARS = {"PWD", "OLDPWD", "SHLVL", "_", "TERM", "LANG"}


def test_a_command_runs_in_the_jobs_directory_environment_and_python_as_its_commands_do(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    async def go() -> tuple[Job, int | None, tuple[int, str, str], tuple[int, str, str]]:
        async with running_job(tmp_path, repo) as job:
            ctx = job.session_context()
            async with ssh_to(tmp_path, ctx) as opts:
                shown = await run(
                    "ssh", *opts, HOST, 'echo $TRAINYARD_RUN; pwd; python -c "import sys; print(sys.prefix)"; id -u'
                )
                env = await run("ssh", *opts, HOST, "env -0; exit 3")
            return job, ctx.uid, shown, env

    job, uid, (code, out, err), (env_code, env_out, _) = asyncio.run(go())

    prefix = (job.dir / "work" / ".record" / "prefix.txt").read_text().strip()
    assert code == 0, err
    assert out.splitlines() == ["r1", str(job.dir / "work"), prefix, str(uid if uid is not None else os.getuid())]
    assert (uid is not None) == jobuser.isolating()  # a root runner's session is the job's own user
    assert env_code == 3
    theirs = {
        k: v for k, v in _env((job.dir / "work" / ".record" / "env.bin").read_bytes()).items() if k not in SESSION_VARS
    }
    ours = {k: v for k, v in _env(env_out.encode()).items() if k not in SESSION_VARS}
    assert ours == theirs
    assert ours["PORT_0"] == "8123" and "TRAINYARD_RUNNER_TOKEN" not in ours


def test_input_reaches_a_command_and_its_exit_status_and_stderr_come_back(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    async def go() -> tuple[int, str, str]:
        async with running_job(tmp_path, repo) as job, ssh_to(tmp_path, job.session_context()) as opts:
            return await run("ssh", *opts, HOST, "tr a-z A-Z; echo oops >&2; exit 42", stdin=b"hello\nworld\n")

    assert asyncio.run(go()) == (42, "HELLO\nWORLD\n", "oops\n")


def test_a_shell_on_a_terminal_with_ssh_tt_keeps_the_jobs_path_whatever_the_users_bashrc_does(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    async def go() -> tuple[Job, tuple[int, str, str]]:
        async with running_job(tmp_path, repo) as job:
            ctx = job.session_context()
            home = Path(ctx.env["HOME"])
            if home.is_relative_to(tmp_path):  # the job's own home (a root runner): a bashrc that resets PATH
                (home / ".bashrc").write_text("PATH=/usr/bin:/bin\necho bashrc-read\n")
            async with ssh_to(tmp_path, ctx) as opts:
                typed = b"tty; echo TERM=$TERM; pwd; echo PATH=$PATH; exit 7\n"
                return job, await run("ssh", *opts, "-tt", HOST, stdin=typed)

    job, (code, out, _) = asyncio.run(go())

    path = _env((job.dir / "work" / ".record" / "env.bin").read_bytes())["PATH"]
    assert code == 7
    assert "/dev/pts/" in out and "TERM=" in out and "/jobs/j1/work\r\n" in out
    assert f"\r\nPATH={path}\r\n" in out
    assert ("bashrc-read" in out) == jobuser.isolating()


def test_a_shell_without_a_terminal_reads_its_commands_from_the_input(tmp_path: Path, repo: tuple[Path, str]) -> None:
    async def go() -> tuple[int, str, str]:
        async with running_job(tmp_path, repo) as job, ssh_to(tmp_path, job.session_context()) as opts:
            return await run("ssh", *opts, "-T", HOST, stdin=b"echo $TRAINYARD_RUN; pwd\nexit 5\n")

    code, out, err = asyncio.run(go())

    assert (code, err) == (5, "")
    assert out.splitlines()[0] == "r1" and out.splitlines()[1].endswith("/jobs/j1/work")


def test_scp_copies_a_50_mb_file_both_ways_byte_identical(tmp_path: Path, repo: tuple[Path, str]) -> None:
    original = tmp_path / "big.bin"
    with open(original, "wb") as f:
        for _ in range(50):
            f.write(os.urandom(1024 * 1024))

    async def go() -> tuple[Job, list[tuple[int, str, str]]]:
        async with running_job(tmp_path, repo) as job, ssh_to(tmp_path, job.session_context()) as opts:
            return job, [
                await run("scp", *opts, str(original), f"{HOST}:big.bin", timeout=120),  # SFTP
                await run("scp", *opts, f"{HOST}:big.bin", str(tmp_path / "back.bin"), timeout=120),
                await run("scp", "-O", *opts, str(original), f"{HOST}:legacy.bin", timeout=120),  # scp -t
                await run("ssh", *opts, HOST, "stat -c %u big.bin legacy.bin; id -u"),
            ]

    job, results = asyncio.run(go())

    assert [r[0] for r in results] == [0, 0, 0, 0], results
    digest = _sha256(original)
    assert _sha256(tmp_path / "back.bin") == digest
    assert _sha256(job.dir / "work" / "big.bin") == digest
    assert _sha256(job.dir / "work" / "legacy.bin") == digest
    owner, owner_legacy, uid = results[3][1].split()
    assert owner == owner_legacy == uid  # written by the job's user


def test_sftp_lists_puts_and_gets_in_the_jobs_tree(tmp_path: Path, repo: tuple[Path, str]) -> None:
    (tmp_path / "up.txt").write_text("up\n")
    batch = tmp_path / "batch"
    batch.write_text(f"pwd\nput {tmp_path / 'up.txt'} up.txt\nmkdir made\nls\nget train.py {tmp_path / 'got.py'}\n")

    async def go() -> tuple[Job, tuple[int, str, str]]:
        async with running_job(tmp_path, repo) as job, ssh_to(tmp_path, job.session_context()) as opts:
            return job, await run("sftp", *opts, "-b", str(batch), HOST)

    job, (code, out, err) = asyncio.run(go())

    assert code == 0, err
    assert f"Remote working directory: {job.dir / 'work'}" in out
    assert (job.dir / "work" / "up.txt").read_text() == "up\n" and (job.dir / "work" / "made").is_dir()
    assert (tmp_path / "got.py").read_text() == "print('v1')\n"


def test_rsync_a_copies_a_directory_over_ssh(tmp_path: Path, repo: tuple[Path, str]) -> None:
    src = tmp_path / "data"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("a\n")
    (src / "sub" / "b.bin").write_bytes(os.urandom(300_000))
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)

    async def go() -> tuple[Job, tuple[int, str, str]]:
        async with running_job(tmp_path, repo) as job, ssh_to(tmp_path, job.session_context()) as opts:
            shell = " ".join(["ssh", *(f"'{o}'" for o in opts)])
            return job, await run("rsync", "-a", "-e", shell, f"{src}/", f"{HOST}:data/")

    job, (code, _, err) = asyncio.run(go())

    assert code == 0, err
    dest = job.dir / "work" / "data"
    assert (dest / "a.txt").read_text() == "a\n"
    assert (dest / "sub" / "b.bin").read_bytes() == (src / "sub" / "b.bin").read_bytes()
    assert (dest / "run.sh").stat().st_mode & 0o777 == 0o755


def test_a_session_of_the_runners_own_user_works_without_a_job_user(tmp_path: Path) -> None:
    """A runner that is not root: the session runs as the runner's user (uid None)."""
    (tmp_path / "tree").mkdir()
    ctx = SessionContext(cwd=tmp_path / "tree", env={"PATH": os.environ["PATH"], "TRAINYARD_RUN": "r9"})
    (tmp_path / "up.txt").write_text("up\n")

    async def go() -> list[tuple[int, str, str]]:
        async with ssh_to(tmp_path, ctx) as opts:
            return [
                await run("ssh", *opts, HOST, "echo $TRAINYARD_RUN $(id -u) $PWD"),
                await run("scp", *opts, str(tmp_path / "up.txt"), f"{HOST}:up.txt"),
            ]

    (code, out, err), (scp_code, _, scp_err) = asyncio.run(go())

    assert (code, out) == (0, f"r9 {os.getuid()} {tmp_path / 'tree'}\n"), err
    assert scp_code == 0, scp_err
    assert (tmp_path / "tree" / "up.txt").read_text() == "up\n"


def test_a_key_that_is_not_registered_is_refused(tmp_path: Path, repo: tuple[Path, str]) -> None:
    ctx = SessionContext(cwd=tmp_path, env=dict(os.environ))

    async def go() -> tuple[int, str, str]:
        async with ssh_to(tmp_path, ctx, registered=False) as opts:
            return await run("ssh", *opts, HOST, "echo in")

    code, out, err = asyncio.run(go())

    assert (code, out) == (255, "")
    assert "Permission denied (publickey)" in err


def test_ssh_l_reaches_a_port_served_on_the_machine_and_nothing_beyond_it(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    local, served = free_ports(2)

    async def go() -> tuple[bytes, tuple[int, str, str]]:
        server = await asyncio.start_server(_pong, "127.0.0.1", served)
        async with running_job(tmp_path, repo) as job, ssh_to(tmp_path, job.session_context()) as opts:
            forward = await asyncio.create_subprocess_exec(
                "ssh", *opts, "-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{local}:127.0.0.1:{served}", HOST
            )
            try:
                reader, writer = await _connect(local)
                writer.write(b"ping\n")
                answer = await reader.readline()
                writer.close()
            finally:
                forward.terminate()
                await forward.wait()
            beyond = await run("ssh", *opts, "-W", "192.0.2.1:80", HOST)
        server.close()
        return answer, beyond

    answer, (code, _, err) = asyncio.run(go())

    assert answer == b"pong ping\n"
    assert code == 255 and "only ports of the job's machine can be reached" in err


def test_ssh_r_listens_on_the_machines_loopback_and_reaches_back_to_the_client(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    remote, served = free_ports(2)
    reach = (
        f'python -c \'import socket; s = socket.create_connection(("127.0.0.1", {remote})); '
        's.sendall(b"ping\\n"); print(s.makefile().readline().strip())\''
    )

    async def go() -> tuple[int, str, str]:
        server = await asyncio.start_server(_pong, "127.0.0.1", served)
        async with running_job(tmp_path, repo) as job, ssh_to(tmp_path, job.session_context()) as opts:
            result = await run(
                "ssh", *opts, "-o", "ExitOnForwardFailure=yes", "-R", f"{remote}:127.0.0.1:{served}", HOST, reach
            )
        server.close()
        return result

    code, out, err = asyncio.run(go())

    assert (code, out) == (0, "pong ping\n"), err


@pytest.mark.skipif(not jobuser.isolating(), reason="a job has a user of its own only under a root runner")
def test_on_a_root_runner_a_session_is_the_jobs_user_and_cannot_read_the_runners_token(
    tmp_path: Path, repo: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_RUNNER_TOKEN", "runner-secret")
    token = tmp_path / "runner" / "runner-token"
    token.parent.mkdir()
    token.write_text("runner-secret\n")
    token.chmod(0o600)
    attempts = "; ".join(
        [
            _attempt("token file", f"cat {token}"),
            _attempt("runner environ", f"cat /proc/{os.getpid()}/environ"),
            _attempt("runner memory", f"head -c1 /proc/{os.getpid()}/mem"),
            _attempt("runner signal", f"kill -0 {os.getpid()}"),
            "env | grep -c RUNNER_TOKEN",
            "id -u",
        ]
    )
    batch = tmp_path / "batch"
    batch.write_text(f"get {token} {tmp_path / 'stolen'}\n")

    async def go() -> tuple[int | None, tuple[int, str, str], tuple[int, str, str]]:
        async with running_job(tmp_path, repo) as job:
            ctx = job.session_context()
            async with ssh_to(tmp_path, ctx) as opts:
                return (
                    ctx.uid,
                    await run("ssh", *opts, HOST, attempts),
                    await run("sftp", *opts, "-b", str(batch), HOST),
                )

    uid, (_, out, _), (sftp_code, _, sftp_err) = asyncio.run(go())

    assert out.splitlines() == [
        "DENIED token file",
        "DENIED runner environ",
        "DENIED runner memory",
        "DENIED runner signal",
        "0",
        str(uid),
    ]
    assert uid is not None and uid >= 1000
    assert sftp_code != 0 and "Permission denied" in sftp_err and not (tmp_path / "stolen").exists()


def test_what_a_session_leaves_running_ends_with_the_job(tmp_path: Path, repo: tuple[Path, str]) -> None:
    left = b"sleep\x001000.5\x00"

    async def go() -> tuple[list[int], list[int]]:
        async with running_job(tmp_path, repo) as job, ssh_to(tmp_path, job.session_context()) as opts:
            await run("ssh", *opts, HOST, "setsid nohup sleep 1000.5 > /dev/null 2>&1 < /dev/null &")
            for _ in range(100):
                if during := _alive(left):
                    break
                await asyncio.sleep(0.05)
        return during, _alive(left)

    during, after = asyncio.run(go())

    assert len(during) == 1 and after == []


def test_a_client_that_stops_reading_holds_the_command_back_instead_of_filling_the_runners_memory(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    size = 64 * 1024 * 3000  # 196 MB
    command = f"head -c {size} /dev/zero; touch .record/all-written"

    async def go() -> tuple[bool, int, int]:
        async with running_job(tmp_path, repo) as job, ssh_to(tmp_path, job.session_context()) as opts:
            rss = _rss()
            client = await asyncio.create_subprocess_exec(
                "ssh", *opts, HOST, command, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
            )
            await asyncio.sleep(3)  # nobody reads the client's output meanwhile
            written_while_stalled = (job.dir / "work" / ".record" / "all-written").exists()
            grown = _rss() - rss
            assert client.stdout is not None
            total = 0
            while chunk := await client.stdout.read(1 << 20):
                total += len(chunk)
            await client.wait()
            return written_while_stalled, grown, total

    written_while_stalled, grown, total = asyncio.run(go())

    assert not written_while_stalled  # the command waited for its reader
    assert grown < 32 * 1024 * 1024
    assert total == size


def test_a_command_that_does_not_read_its_input_holds_the_client_back(tmp_path: Path, repo: tuple[Path, str]) -> None:
    size = 100 * 1024 * 1024  # sent while the command sleeps
    with open(tmp_path / "input.bin", "wb") as f:
        f.truncate(size)

    async def go() -> tuple[int, int, bytes]:
        async with running_job(tmp_path, repo) as job, ssh_to(tmp_path, job.session_context()) as opts:
            rss = _rss()
            with open(tmp_path / "input.bin", "rb") as data:
                client = await asyncio.create_subprocess_exec(
                    "ssh", *opts, HOST, "sleep 3; wc -c", stdin=data, stdout=asyncio.subprocess.PIPE
                )
            await asyncio.sleep(2.5)
            grown = _rss() - rss
            out, _ = await client.communicate()
            return grown, await client.wait(), out

    grown, code, out = asyncio.run(go())

    assert grown < 32 * 1024 * 1024
    assert (code, out.strip()) == (0, str(size).encode())


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_window_change_and_a_signal_reach_the_process(tmp_path: Path, repo: tuple[Path, str]) -> None:
    """What the stock client sends when its terminal is resized, and a
    ``signal`` request (asyncssh's client: ``ssh`` has no command for it)."""

    async def go() -> tuple[str, int | None, str | None]:
        async with running_job(tmp_path, repo) as job, _asyncssh_to(tmp_path, job.session_context()) as conn:
            shell = await conn.create_process(term_type="xterm", term_size=(80, 24), encoding=None)
            shell.change_terminal_size(120, 40)
            await asyncio.sleep(0.2)
            shell.stdin.write(b"stty size; exit\n")
            seen = (await asyncio.wait_for(shell.stdout.read(), 15)).decode()
            sleeper = await conn.create_process("sleep 100", encoding=None)
            await asyncio.sleep(0.3)
            sleeper.send_signal("TERM")
            result = await asyncio.wait_for(sleeper.wait(), 15)
            return seen, result.exit_status, result.exit_signal[0] if result.exit_signal else None

    seen, status, signal_name = asyncio.run(go())

    assert "40 120\r\n" in seen
    assert (status, signal_name) == (-1, "TERM")


def test_a_job_taken_over_from_an_earlier_runner_gets_its_commands_environment_from_its_process() -> None:
    """A resumed job's ``job.json`` holds no variable or secret: a session
    reads them from the process of its commands (the shim's child)."""
    shim = subprocess.Popen(["bash", "-c", "TRAINYARD_RUN=r1 PORT_0=8123 bash -c 'sleep 30'; :"])
    try:
        for _ in range(100):
            env = commands_environ(shim.pid)
            if env is not None and "PORT_0" in env:
                break
            time.sleep(0.02)
    finally:
        shim.kill()
        shim.wait()

    assert env is not None and env["TRAINYARD_RUN"] == "r1" and env["PORT_0"] == "8123"
    assert commands_environ(shim.pid) is None  # gone


def test_sessions_on_one_connection_are_capped(tmp_path: Path, repo: tuple[Path, str]) -> None:
    async def go() -> tuple[str, str]:
        async with running_job(tmp_path, repo) as job, _asyncssh_to(tmp_path, job.session_context()) as conn:
            held = [await conn.create_process("sleep 60") for _ in range(MAX_SESSIONS)]
            with pytest.raises(asyncssh.ChannelOpenError) as refused:
                await conn.create_process("echo one too many")
            held[0].close()
            await held[0].wait_closed()
            after = await conn.run("echo again", check=True)
            return refused.value.reason, str(after.stdout)

    reason, after = asyncio.run(go())

    assert reason == f"at most {MAX_SESSIONS} sessions at once on one connection"
    assert after == "again\n"


@contextlib.asynccontextmanager
async def _asyncssh_to(tmp_path: Path, ctx: SessionContext) -> AsyncIterator[asyncssh.SSHClientConnection]:
    """asyncssh's client through the bridge, for what ``ssh`` has no command for."""
    async with ssh_to(tmp_path, ctx) as opts:
        key = asyncssh.read_private_key(opts[opts.index("-i") + 1])
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(tmp_path / "relay.sock"))
        async with asyncssh.connect(sock=sock, username="me", client_keys=[key], known_hosts=None) as conn:
            yield conn


def _attempt(what: str, command: str) -> str:
    return f"if {command} > /dev/null 2>&1; then echo 'READ {what}'; else echo 'DENIED {what}'; fi"


def _alive(cmdline: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            live = entry.name.isdigit() and (entry / "cmdline").read_bytes() == cmdline
            if live and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


async def _pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    line = await reader.readline()
    writer.write(b"pong " + line)
    await writer.drain()
    writer.close()


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The forward's local end, once ``ssh -L`` listens on it."""
    for _ in range(300):
        try:
            return await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()

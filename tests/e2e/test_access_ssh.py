"""SSH into a running job with the stock OpenSSH client, through the real
server's relay, to a real local runner (docs/ACCESS.md): the host entries
`trainyard ssh-config` writes, used as a user would (`ssh`, `scp`, `rsync`,
`ssh -L`), `trainyard ssh RUN -- CMD` and `trainyard forward`; and who is
refused: a removed key, a viewer, another workspace's member.

The test's home is not the one ssh finds in the password database, so ssh
is given the user's ``~/.ssh/config`` with ``-F`` (it includes the Trainyard
file, as on a real machine) and the key with ``-i``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import TRAINYARD, User, commit_all, make_repo, run_name_of
from tests.support.stack import Stack

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("ssh", "scp", "ssh-keygen", "rsync")),
    reason="needs the stock OpenSSH client (openssh-client) and rsync",
)

HOLD = """\
workflows:
  - name: hold
    provider: bash
    ports: 1
    env:
      GREETING: hello from the job
    commands:
      - mkdir -p served && echo "served by the job" > served/index.html
      - echo "job-pwd=$(pwd)"
      - python -c "import sys; print('job-prefix=' + sys.prefix)"
      - python -m http.server "$PORT_0" --bind 127.0.0.1 --directory served &
      - while [ ! -e "{stop}" ]; do sleep 0.5; done
"""
MB = 1024 * 1024


@dataclass
class Client:
    """One person's machine: a home with a key, the CLI and ssh configured for ``user``."""

    user: User
    home: Path
    workspace: str

    @property
    def key(self) -> Path:
        return self.home / ".ssh" / "id_ed25519"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "XDG_CONFIG_HOME")}
        return {**env, "HOME": str(self.home), "TRAINYARD_URL": self.user.stack.url,
                "TRAINYARD_TOKEN": self.user.token, "TRAINYARD_WORKSPACE": self.workspace}  # fmt: skip

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(TRAINYARD), *args], cwd=self.home, env=self.env(), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip

    def ssh_options(self) -> list[str]:
        return ["-F", str(self.home / ".ssh" / "config"), "-i", str(self.key), "-o", "IdentitiesOnly=yes",
                "-o", "BatchMode=yes"]  # fmt: skip

    def tool(self, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=self.home, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip

    def ssh(self, host: str, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.tool("ssh", *self.ssh_options(), host, *command, timeout=timeout)


@dataclass
class Held:
    """A run whose one job runs until the test module is done."""

    name: str
    job: dict[str, Any]
    pwd: str
    prefix: str
    repo: Path


def _client(user: User, root: Path, workspace: str, *, key: bool = True) -> Client:
    home = root / f"home-{user.name}"
    (home / ".ssh").mkdir(parents=True, exist_ok=True, mode=0o700)
    client = Client(user, home, workspace)
    if key and not client.key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{user.name}@e2e", "-f",
                        str(client.key)], check=True)  # fmt: skip
    return client


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainyard_runner.jobuser import isolating, make_reachable

    path = tmp_path_factory.mktemp("ssh")
    if isolating():
        path.chmod(0o1777)
        make_reachable(path)
    return path


@pytest.fixture(scope="module")
def held(alice: User, scratch: Path) -> Iterator[Held]:
    repo = make_repo(scratch / "repo")
    stop = scratch / "stop"
    (repo / ".trainyard" / "workflows.yaml").write_text(HOLD.format(stop=stop))
    commit_all(repo, "a job that holds")
    name = run_name_of(alice.cli(repo, "run", "hold", "-d"))
    try:
        run = alice.wait(name, lambda r: r["jobs"][0]["status"] == "running" and bool(r["jobs"][0]["ports"]), 180)
        job = run["jobs"][0]
        text = _until("the job's first lines", lambda: _log_text(alice, job["id"], "job-prefix="), 120)
        values = dict(line.split("=", 1) for line in text.splitlines() if line.startswith("job-"))
        yield Held(name, job, values["job-pwd"], values["job-prefix"], repo)
    finally:
        stop.touch()
        alice.cli(repo, "stop", name)


@pytest.fixture(scope="module")
def alice_here(alice: User, held: Held, scratch: Path) -> Client:
    """Alice's machine: her key registered, the host entries written."""
    client = _client(alice, scratch, alice.workspace)
    added = client.cli("ssh-key", "add")
    assert added.returncode == 0 or "You have this key already" in added.stderr, added.stderr
    configured = client.cli("ssh-config")
    assert configured.returncode == 0, configured.stderr
    assert f"trainyard-{held.name}\t{held.name}" in configured.stdout.splitlines()
    return client


# ------------------------------------------------------------------ the stock client


def test_ssh_runs_in_the_jobs_directory_with_its_variables_and_python(alice_here: Client, held: Held) -> None:
    command = 'echo "$TRAINYARD_RUN_NAME"; echo "$GREETING"; pwd; python -c "import sys; print(sys.prefix)"'

    done = alice_here.ssh(f"trainyard-{held.name}", command)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [held.name, "hello from the job", held.pwd, held.prefix]


def test_the_user_config_includes_the_trainyard_file_once_and_keeps_the_rest(alice_here: Client) -> None:
    again = alice_here.cli("ssh-config")
    text = (alice_here.home / ".ssh" / "config").read_text()

    assert again.returncode == 0, again.stderr
    assert text.count("Include ") == 1
    assert text.splitlines()[1] == f"Include {alice_here.home}/.config/trainyard/ssh/config"


def test_scp_copies_50_mb_both_ways_byte_identical(alice_here: Client, held: Held, tmp_path: Path) -> None:
    sent = tmp_path / "big.bin"
    sent.write_bytes(os.urandom(50 * MB))
    back = tmp_path / "back.bin"
    host = f"trainyard-{held.name}"
    scp = ["scp", *alice_here.ssh_options()]

    up = alice_here.tool(*scp, str(sent), f"{host}:big.bin")
    down = alice_here.tool(*scp, f"{host}:big.bin", str(back))
    remote = alice_here.ssh(host, "sha256sum big.bin && rm big.bin")

    assert (up.returncode, down.returncode) == (0, 0), up.stderr + down.stderr
    digest = hashlib.sha256(sent.read_bytes()).hexdigest()
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest
    assert remote.stdout.split()[0] == digest


def test_rsync_copies_a_directory(alice_here: Client, held: Held, tmp_path: Path) -> None:
    tree = tmp_path / "data"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("alpha\n")
    (tree / "sub" / "b.bin").write_bytes(os.urandom(300_000))
    os.chmod(tree / "a.txt", 0o640)
    ssh = " ".join(["ssh", *alice_here.ssh_options()])

    done = alice_here.tool("rsync", "-a", "-e", ssh, f"{tree}/", f"trainyard-{held.name}:data/")
    listed = alice_here.ssh(f"trainyard-{held.name}", "cd data && find . -type f | sort && sha256sum sub/b.bin "
                            "&& stat -c %a a.txt && cd .. && rm -r data")  # fmt: skip

    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256((tree / "sub" / "b.bin").read_bytes()).hexdigest()
    assert listed.stdout.splitlines() == ["./a.txt", "./sub/b.bin", f"{digest}  sub/b.bin", "640"]


def test_ssh_local_forward_reaches_the_port_the_job_serves(alice_here: Client, held: Held) -> None:
    local = _free_port()
    [port] = held.job["ports"]
    argv = ["ssh", *alice_here.ssh_options(), "-N", "-o", "ExitOnForwardFailure=yes",
            "-L", f"127.0.0.1:{local}:127.0.0.1:{port}", f"trainyard-{held.name}"]  # fmt: skip
    with _background(argv, alice_here.env()) as ssh:
        page = _until("the forwarded page", lambda: _get(f"http://127.0.0.1:{local}/index.html") or _dead(ssh), 30)

    assert page == "served by the job\n"


# ------------------------------------------------------------------ the CLI


def test_trainyard_ssh_prints_the_commands_output_and_returns_its_exit_code(alice_here: Client, held: Held) -> None:
    done = alice_here.cli("ssh", held.name, "--", 'echo "out on $TRAINYARD_RUN_NAME"; echo oops >&2; exit 7')

    assert done.returncode == 7
    assert done.stdout == f"out on {held.name}\n"
    assert done.stderr.endswith("oops\n")


def test_trainyard_ssh_on_a_machine_with_no_key_makes_and_registers_one(alice: User, held: Held, scratch: Path) -> None:
    fresh = _client(alice, scratch / "fresh", alice.workspace, key=False)

    first = fresh.cli("ssh", held.name, "--", "echo", "first")
    second = fresh.cli("ssh", held.name, "--", "echo", "second")

    made = fresh.home / ".config" / "trainyard" / "ssh" / "id_ed25519"
    assert (first.returncode, first.stdout) == (0, "first\n"), first.stderr
    assert first.stderr.startswith(f"Made an SSH key for Trainyard, {made}, registered as ")
    assert (second.returncode, second.stdout, second.stderr) == (0, "second\n", "")
    fingerprint = subprocess.run(["ssh-keygen", "-lf", f"{made}.pub"], capture_output=True, text=True).stdout.split()[1]
    assert fingerprint in [k["fingerprint"] for k in alice.api("GET", "/api/v1/me/ssh-keys/").json()]
    fresh.cli("ssh-key", "rm", fingerprint)


def test_trainyard_forward_prints_the_local_url_and_forwards_to_port_0(alice_here: Client, held: Held) -> None:
    local = _free_port()
    argv = [str(TRAINYARD), "forward", held.name, f"{local}:PORT_0"]
    with _background(argv, alice_here.env()) as forward:
        page = _until("the forwarded page", lambda: _get(f"http://127.0.0.1:{local}/index.html") or _dead(forward), 30)
        forward.terminate()
        out = forward.communicate(timeout=10)[0]

    assert page == "served by the job\n"
    assert out.splitlines()[0] == f"http://127.0.0.1:{local} -> port {held.job['ports'][0]} of trainyard-{held.name}"


# ------------------------------------------------------------------ refusals


def test_a_removed_key_is_refused_and_its_live_session_ends(alice: User, held: Held, scratch: Path) -> None:
    client = _client(alice, scratch / "revoked", alice.workspace)
    assert client.cli("ssh-key", "add", "--name", "soon-gone").returncode == 0
    assert client.cli("ssh-config", held.name).returncode == 0
    host = f"trainyard-{held.name}"
    assert client.ssh(host, "true").returncode == 0

    argv = ["ssh", *client.ssh_options(), host, "sleep 120"]
    with _background(argv, client.env()) as live:
        time.sleep(3)  # the session is up
        removed = client.cli("ssh-key", "rm", "soon-gone")
        ended = _until("the live session to end", lambda: live.poll() is not None, 30)
    refused = client.ssh(host, "true")

    assert removed.returncode == 0, removed.stderr
    assert ended
    assert refused.returncode == 255
    assert "Permission denied (publickey" in refused.stderr


def test_a_viewer_is_refused_with_the_servers_message(stack: Stack, alice: User, held: Held, scratch: Path) -> None:
    viewer = User("vera", stack.issue_token("vera"), stack)
    _member(stack, workspace=alice.workspace, username="vera", role="viewer")
    client = _client(viewer, scratch, alice.workspace)
    assert client.cli("ssh-key", "add").returncode == 0
    configured = client.cli("ssh-config", held.name)
    said = _refusal(viewer, alice.workspace, held.name)

    # Not vera's default workspace: its hosts carry its name.
    host = f"trainyard-{alice.workspace}-{held.name}"
    done = client.ssh(host, "true")

    assert configured.stdout == f"{host}\t{held.name}\n", configured.stderr
    assert done.returncode == 255
    assert f"error: {said}" in done.stderr
    assert said


def test_another_workspaces_member_is_told_the_run_does_not_exist(bob: User, held: Held, alice: User,
                                                                   scratch: Path) -> None:  # fmt: skip
    client = _client(bob, scratch, alice.workspace)
    assert client.cli("ssh-key", "add").returncode == 0
    said = _refusal(bob, alice.workspace, held.name)

    proxied = client.cli("ssh-proxy", held.name, "--alias", f"trainyard-{held.name}", "--workspace", alice.workspace)
    via_cli = client.cli("ssh", held.name, "--", "true")

    assert bob.api("POST", f"/api/v1/workspaces/{alice.workspace}/runs/{held.name}/sessions/",
                   json={"kind": "ssh"}).status_code == 404  # fmt: skip
    assert (proxied.returncode, proxied.stderr) == (1, f"error: {said}\n")
    assert via_cli.returncode == 1 and via_cli.stderr.startswith("error: ")
    assert not (client.home / ".config" / "trainyard" / "ssh" / "known_hosts" / f"trainyard-{held.name}").exists()


# ------------------------------------------------------------------ helpers


def _refusal(user: User, workspace: str, run: str) -> str:
    answer = user.api("POST", f"/api/v1/workspaces/{workspace}/runs/{run}/sessions/", json={"kind": "ssh"})
    assert answer.status_code in (403, 404), answer.text
    body = answer.json()
    return str(body.get("message") or body.get("detail"))


def _member(stack: Stack, *, workspace: str, username: str, role: str) -> None:
    stack.manage(
        "shell",
        "-c",
        "from backend.accounts.models import Membership, User, Workspace; "
        f"Membership.objects.get_or_create(workspace=Workspace.objects.get(slug={workspace!r}), "
        f"user=User.objects.get(username={username!r}), defaults={{'role': {role!r}}})",
    )


def _log_text(user: User, job: str, needle: str) -> str:
    lines = user.api("GET", f"/api/v1/workspaces/{user.workspace}/jobs/{job}/logs/").json().get("lines", [])
    text = "\n".join(line["text"] for line in lines)
    return text if needle in text else ""


def _until(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class _Died(AssertionError):
    pass


def _dead(process: subprocess.Popen[str]) -> bool:
    if process.poll() is not None:
        raise _Died(f"exited with {process.returncode}: {process.stderr.read() if process.stderr else ''}")
    return False


@contextmanager
def _background(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

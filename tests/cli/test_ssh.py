"""The CLI's SSH side without a server: public keys read (never a private
one), fingerprints as ``ssh-keygen -l``, the SSH config written (one
``Include`` at the top of the user's file, idempotent, never clobbering),
the ssh command line, the first-use key, the proxy's pump and refusals,
and ``forward``'s port specs. The real thing, through a real relay and
runner: tests/e2e/test_access_ssh.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from trainyard import proxy, sshclient
from trainyard.sshconfig import HostEntry, Scope, include_in_user_config, ssh_dir, write_entries
from trainyard.sshkeys import fingerprint
from websockets.sync.server import ServerConnection, serve

from tests.cli.fakes import WS, FakeRest, invoke, make_job, make_run, rest_client, use

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs openssh-client")

URL = "http://trainyard.test"
KEY_OUT = {"id": "k-1", "name": "me@laptop", "fingerprint": "SHA256:x", "public_key": "ssh-ed25519 AAAA",
           "created_at": "2026-01-01T00:00:00Z", "last_used_at": None}  # fmt: skip


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own: its ~/.ssh, no agent."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def _keygen(path: Path, kind: str = "ed25519") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "me@laptop", "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text()


# ------------------------------------------------------------------ keys


def test_the_fingerprint_is_the_one_ssh_keygen_prints(home: Path) -> None:
    line = _keygen(home / ".ssh" / "id_rsa", "rsa")
    listed = subprocess.run(["ssh-keygen", "-lf", str(home / ".ssh" / "id_rsa.pub")], capture_output=True, text=True)

    assert fingerprint(line) == listed.stdout.split()[1]


def test_ssh_key_add_sends_the_default_public_key(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = _keygen(home / ".ssh" / "id_ed25519")
    rest = FakeRest({("POST", "/api/v1/me/ssh-keys/"): httpx.Response(201, json=KEY_OUT)})
    use(monkeypatch, URL, rest)

    code, _, err = invoke("ssh-key", "add", "--name", "work")

    assert code == 0
    assert json.loads(rest.requests[0].content) == {"public_key": line.strip(), "name": "work"}
    assert err == f"Added SSH key me@laptop (SHA256:x) from {home}/.ssh/id_ed25519.pub\n"


def test_ssh_key_add_refuses_a_private_key_and_sends_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _keygen(home / ".ssh" / "id_ed25519")
    lone = home / "lone_key"
    shutil.copy(home / ".ssh" / "id_ed25519", lone)
    rest = FakeRest({})
    use(monkeypatch, URL, rest)

    beside = invoke("ssh-key", "add", str(home / ".ssh" / "id_ed25519"))
    alone = invoke("ssh-key", "add", str(lone))

    assert beside == (1, "", f"error: {home}/.ssh/id_ed25519 is a private key: add its public half, "
                             f"trainyard ssh-key add {home}/.ssh/id_ed25519.pub\n")  # fmt: skip
    assert alone[0] == 1
    assert f"{lone} holds a PRIVATE key: it was not sent" in alone[2]
    assert rest.requests == []


def test_ssh_key_add_without_a_key_says_how_to_make_one(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, URL, FakeRest({}))

    code, _, err = invoke("ssh-key", "add")

    assert code == 1
    assert "no public key in ~/.ssh" in err and "ssh-keygen -t ed25519" in err


def test_ssh_key_rm_names_the_key_by_fingerprint_in_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    path = "/api/v1/me/ssh-keys/SHA256:ab/c+d/"
    rest = FakeRest({("DELETE", path): httpx.Response(204)})
    use(monkeypatch, URL, rest)

    code, _, err = invoke("ssh-key", "rm", "SHA256:ab/c+d")

    assert (code, err) == (0, "Removed SSH key SHA256:ab/c+d\n")
    assert rest.requests[0].url.raw_path == b"/api/v1/me/ssh-keys/SHA256:ab%2Fc%2Bd/"


# ------------------------------------------------------------------ the SSH config


def _entry(run: str = "brave-otter-3", workspace: str = "ws1", job: str = "") -> HostEntry:
    alias = f"trainyard-{run}" + (f"-{job}" if job else "")
    return HostEntry(alias, Scope(URL, workspace), run, job)


def test_the_include_goes_on_top_once_and_the_users_file_is_kept_as_it_was(home: Path) -> None:
    user_config = home / ".ssh" / "config"
    user_config.parent.mkdir()
    theirs = "Host github.com\n  User git\n  IdentityFile ~/.ssh/gh\n"
    user_config.write_text(theirs)
    user_config.chmod(0o640)

    path = write_entries([_entry()], identity=None)
    write_entries([_entry("calm-heron-4")], identity=None)
    text = user_config.read_text()

    assert text == f"# Added by trainyard: SSH into running jobs (trainyard ssh-config).\nInclude {path}\n\n" + theirs
    assert user_config.stat().st_mode & 0o777 == 0o640


def test_an_include_inside_a_host_block_does_not_count_and_a_symlinked_config_stays_a_link(home: Path) -> None:
    dotfiles = home / "dotfiles" / "ssh_config"
    dotfiles.parent.mkdir()
    path = ssh_dir() / "config"
    dotfiles.write_text(f"Host box\n  Include {path}\n")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "config").symlink_to(dotfiles)

    include_in_user_config(path)

    assert (home / ".ssh" / "config").is_symlink()
    assert dotfiles.read_text().splitlines()[1:3] == [f"Include {path}", ""]
    assert dotfiles.read_text().endswith(f"Host box\n  Include {path}\n")


def test_a_tilde_include_at_the_top_is_recognised(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (home / ".ssh").mkdir()
    mine = "Include ~/.config/trainyard/ssh/config\nHost *\n  ServerAliveInterval 5\n"
    (home / ".ssh" / "config").write_text(mine)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))

    include_in_user_config(ssh_dir() / "config")

    assert (home / ".ssh" / "config").read_text() == mine


def test_writing_a_scope_replaces_its_stale_hosts_and_keeps_the_other_scopes(home: Path) -> None:
    write_entries([_entry("old-run-1"), _entry("other-1", workspace="team")], identity=None)

    path = write_entries([_entry("new-run-2")], replace_scope=Scope(URL, "ws1"), identity=None)
    text = path.read_text()

    assert "Host trainyard-new-run-2\n" in text and "Host trainyard-other-1\n" in text
    assert "old-run-1" not in text
    assert path.stat().st_mode & 0o777 == 0o600


def test_the_written_config_is_one_ssh_reads_with_real_host_key_checks(home: Path) -> None:
    identity = home / "key"
    path = write_entries([_entry(job="train")], identity=identity)

    resolved = subprocess.run(
        ["ssh", "-G", "-F", str(path), "trainyard-brave-otter-3-train"], capture_output=True, text=True, check=True
    ).stdout.splitlines()

    assert "stricthostkeychecking true" in resolved
    assert "hostkeyalias trainyard-brave-otter-3-train" in resolved
    assert f"userknownhostsfile {ssh_dir()}/known_hosts/trainyard-brave-otter-3-train" in resolved
    assert f"identityfile {identity}" in resolved
    proxy_line = next(line for line in resolved if line.startswith("proxycommand "))
    assert proxy_line.endswith(
        f"-m trainyard ssh-proxy brave-otter-3 --job train --url {URL} --workspace ws1 "
        "--alias trainyard-brave-otter-3-train"
    )


# ------------------------------------------------------------------ trainyard ssh


ME = {"username": "olivia", "avatar_url": "", "default_workspace": "mine", "workspaces": []}


def _ssh_world(
    monkeypatch: pytest.MonkeyPatch, keys: list[dict[str, Any]], *, jobs: int = 1
) -> tuple[FakeRest, list[list[str]]]:
    run_jobs = [make_job("running", id=f"j{i}", name=f"job{i}") for i in range(jobs)]
    added = {**KEY_OUT, "name": "trainyard@host", "fingerprint": "SHA256:new"}
    rest = FakeRest({
        ("GET", f"{WS}/runs/brave-otter-3/"): httpx.Response(200, json=make_run("running", name="brave-otter-3", jobs=run_jobs)),
        ("GET", "/api/v1/me/ssh-keys/"): httpx.Response(200, json=keys),
        ("POST", "/api/v1/me/ssh-keys/"): httpx.Response(201, json=added),
        ("GET", "/api/v1/me/"): httpx.Response(200, json=ME),
    })  # fmt: skip
    use(monkeypatch, URL, rest)
    execs: list[list[str]] = []
    monkeypatch.setattr(sshclient, "exec_ssh", lambda argv: execs.append(argv))
    monkeypatch.setattr("trainyard.commands.ssh.exec_ssh", lambda argv: execs.append(argv))
    monkeypatch.setattr("trainyard.commands.forward.exec_ssh", lambda argv: execs.append(argv))
    return rest, execs


def test_first_use_makes_and_registers_a_trainyard_key_and_runs_ssh_with_it(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rest, execs = _ssh_world(monkeypatch, [])

    code, _, err = invoke("ssh", "brave-otter-3", "--", "echo", "$TRAINYARD_RUN")

    key = ssh_dir() / "id_ed25519"
    posted = json.loads(next(r for r in rest.requests if r.method == "POST").content)
    assert code == 0
    assert posted["public_key"] == Path(f"{key}.pub").read_text().strip()
    assert key.stat().st_mode & 0o777 == 0o600
    assert err.startswith(f"Made an SSH key for Trainyard, {key}, registered as trainyard@host (SHA256:new)")
    config = ssh_dir() / "config"
    assert execs == [[shutil.which("ssh"), "-F", str(config), "-i", str(key), "trainyard-brave-otter-3", "echo",
                      "$TRAINYARD_RUN"]]  # fmt: skip
    assert (home / ".ssh" / "config").read_text().startswith("# Added by trainyard")


def test_a_registered_key_of_ones_own_is_offered_and_nothing_is_made(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = _keygen(home / ".ssh" / "id_ecdsa", "ecdsa")
    rest, execs = _ssh_world(monkeypatch, [{**KEY_OUT, "fingerprint": fingerprint(line)}], jobs=2)

    code, _, err = invoke("ssh", "brave-otter-3", "--job", "job1")

    assert (code, err) == (0, "")
    assert not (ssh_dir() / "id_ed25519").exists()
    assert [r.method for r in rest.requests] == ["GET", "GET"]
    assert execs[0][-3:] == ["-i", str(home / ".ssh" / "id_ecdsa"), "trainyard-brave-otter-3-job1"]


def test_wait_waits_for_a_pending_job_to_run_saying_so_once_per_status(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rest, execs = _ssh_world(monkeypatch, [])
    route = ("GET", f"{WS}/runs/brave-otter-3/")
    answers = [
        httpx.Response(200, json=make_run(status, name="brave-otter-3", jobs=[make_job(status, name="job0")]))
        for status in ("pending", "pending", "assigned", "running")
    ]

    class InTurn(dict[tuple[str, str], httpx.Response]):
        """The run's page answers each status in turn, then stays running."""

        def __getitem__(self, key: tuple[str, str]) -> httpx.Response:
            if key == route:
                return answers.pop(0) if len(answers) > 1 else answers[0]
            return super().__getitem__(key)

    rest.routes = InTurn(rest.routes)
    monkeypatch.setattr(sshclient, "WAIT_POLL_SECONDS", 0.01)

    code, _, err = invoke("ssh", "brave-otter-3", "--wait", "--", "true")

    assert code == 0 and len(execs) == 1
    assert err.splitlines()[:2] == [
        "job job0 of run brave-otter-3 is pending: waiting until it runs (Ctrl-C stops waiting)",
        "job job0 of run brave-otter-3 is assigned: waiting until it runs (Ctrl-C stops waiting)",
    ]


def test_a_run_of_several_running_jobs_needs_a_job_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _, execs = _ssh_world(monkeypatch, [], jobs=2)

    code, _, err = invoke("ssh", "brave-otter-3")

    assert code == 1
    assert err == "error: run brave-otter-3 has several jobs: name one with --job (job0 (running), job1 (running))\n"
    assert execs == []


def test_forward_maps_named_and_numbered_ports_and_prints_the_local_urls(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = _keygen(home / ".ssh" / "id_ed25519")
    _, execs = _ssh_world(monkeypatch, [{**KEY_OUT, "fingerprint": fingerprint(line)}])
    run = make_run("running", name="brave-otter-3", jobs=[make_job("running", name="job0", ports=[41234])])
    use(monkeypatch, URL, FakeRest({
        ("GET", f"{WS}/runs/brave-otter-3/"): httpx.Response(200, json=run),
        ("GET", "/api/v1/me/ssh-keys/"): httpx.Response(200, json=[{**KEY_OUT, "fingerprint": fingerprint(line)}]),
    }))  # fmt: skip

    code, out, _ = invoke("forward", "brave-otter-3", "8888", "9000:PORT_0", "PORT_0")
    bad = invoke("forward", "brave-otter-3", "88:PORT_3")

    assert code == 0
    assert out.splitlines() == [
        "http://127.0.0.1:8888 -> port 8888 of trainyard-brave-otter-3",
        "http://127.0.0.1:9000 -> port 41234 of trainyard-brave-otter-3",
        "http://127.0.0.1:41234 -> port 41234 of trainyard-brave-otter-3",
    ]
    assert execs[0][-10:] == ["-N", "-o", "ExitOnForwardFailure=yes", "-L", "127.0.0.1:8888:127.0.0.1:8888",
                              "-L", "127.0.0.1:9000:127.0.0.1:41234", "-L", "127.0.0.1:41234:127.0.0.1:41234",
                              "trainyard-brave-otter-3"]  # fmt: skip
    assert bad[0] == 1 and "job job0 has no PORT_3: its ports are [41234]" in bad[2]


def test_a_workspace_other_than_the_default_is_in_the_host_name(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = _keygen(home / ".ssh" / "id_ed25519")
    _, execs = _ssh_world(monkeypatch, [{**KEY_OUT, "fingerprint": fingerprint(line)}])
    monkeypatch.setenv("TRAINYARD_WORKSPACE", "ws1")  # the user's default is "mine"

    invoke("ssh", "brave-otter-3")

    assert execs[0][-1] == "trainyard-ws1-brave-otter-3"


# ------------------------------------------------------------------ the proxy


class FakeRelay:
    """The client end of a session: checks the grant's token, says ready,
    echoes each binary frame back upper-cased, then ends with a reason."""

    def __init__(self, *, close: tuple[int, str] | None = None) -> None:
        self.close = close
        self.received = b""

    def handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        if ws.request.headers.get("Authorization") != "Bearer grant-token":
            ws.close(4401, "bad token")
            return
        if self.close:
            ws.close(*self.close)
            return
        ws.send(json.dumps({"type": "ready"}))
        for frame in ws:
            assert isinstance(frame, bytes)
            self.received += frame
            ws.send(frame.upper())
            if self.received.endswith(b"bye"):
                ws.send(json.dumps({"type": "end", "reason": "the job ended"}))
                ws.close()
                return


def _relay(relay: FakeRelay) -> Iterator[str]:
    with serve(relay.handle, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}/ws/v1/relay/s-1/"
        finally:
            server.shutdown()
            thread.join(5)


def test_the_pump_carries_bytes_both_ways_and_returns_the_servers_reason() -> None:
    relay = FakeRelay()
    up_read, up_write = os.pipe()
    down_read, down_write = os.pipe()
    for url in _relay(relay):
        os.write(up_write, b"hello, bye")
        reason = proxy.pump({"url": url, "token": "grant-token"}, read_fd=up_read, write_fd=down_write)
        os.close(down_write)
        echoed = os.read(down_read, 100)

    assert (reason, echoed, relay.received) == ("the job ended", b"HELLO, BYE", b"hello, bye")


@pytest.mark.parametrize(
    ("close", "says"),
    [
        (
            (4409, "job train ended (spot notice): resume with trainyard ssh"),
            "the job's attempt ended: job train ended",
        ),
        ((4404, ""), "grant is unknown or expired"),
    ],
)
def test_the_pump_names_the_servers_close(close: tuple[int, str], says: str) -> None:
    read_fd, write_fd = os.pipe()
    for url in _relay(FakeRelay(close=close)):
        with pytest.raises(proxy.ProxyError, match=says):
            proxy.pump({"url": url, "token": "grant-token"}, read_fd=read_fd, write_fd=write_fd)


def test_ssh_proxy_writes_the_host_key_before_carrying_a_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "trainyard_test")
    grant = {"id": "s-1", "token": "grant-token", "url": "ws://x", "host_key": "ssh-ed25519 AAAAC3Nz hostkey"}
    monkeypatch.setattr(
        "trainyard.api.Client.create_session", lambda self, run, **kw: {**grant, "asked": (run, kw, self.workspace)}
    )
    seen: list[Any] = []
    known = ssh_dir() / "known_hosts" / "trainyard-brave-otter-3"
    monkeypatch.setattr(
        "trainyard.commands.ssh_proxy.pump",
        lambda g, **fds: seen.append((g["asked"], known.read_text())) or "the job ended",
    )

    code, _, err = invoke("ssh-proxy", "brave-otter-3", "--job", "train", "--alias", "trainyard-brave-otter-3",
                          "--workspace", "team")  # fmt: skip

    assert code == 0
    assert seen == [(("brave-otter-3", {"kind": "ssh", "job": "train"}, "team"),
                     "trainyard-brave-otter-3 ssh-ed25519 AAAAC3Nz\n")]  # fmt: skip
    assert err == "trainyard: the session ended: the job ended\n"


def test_ssh_proxy_prints_the_servers_refusal_and_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_TOKEN", "trainyard_test")
    detail = "job train is pending: wait until it runs (trainyard logs -f brave-otter-3)"
    rest = FakeRest({("POST", f"{WS}/runs/brave-otter-3/sessions/"): httpx.Response(409, json={"detail": detail})})
    monkeypatch.setattr("trainyard.commands.ssh_proxy.Client", lambda url, token, workspace: rest_client(url, rest))

    code, out, err = invoke("ssh-proxy", "brave-otter-3", "--alias", "trainyard-brave-otter-3")

    assert (code, out, err) == (1, "", f"error: {detail}\n")
    assert not (ssh_dir() / "known_hosts" / "trainyard-brave-otter-3").exists()


@pytest.mark.parametrize(
    ("status", "says"),
    [
        ("pending", "job job0 of run brave-otter-3 is pending: wait until it runs (trainyard ssh brave-otter-3 --wait"
                    " waits for it)"),
        ("succeeded", "job job0 of run brave-otter-3 is succeeded: sessions reach running jobs only; re-run it "
                      "(trainyard rerun brave-otter-3) to get a running one"),
    ],
)  # fmt: skip
def test_a_job_that_is_not_running_is_refused_before_any_key_is_made(
    monkeypatch: pytest.MonkeyPatch, status: str, says: str
) -> None:
    run = make_run(status, name="brave-otter-3", jobs=[make_job(status, name="job0")])
    rest = FakeRest({("GET", f"{WS}/runs/brave-otter-3/"): httpx.Response(200, json=run)})
    use(monkeypatch, URL, rest)

    code, _, err = invoke("ssh", "brave-otter-3")

    assert (code, err) == (1, f"error: {says}\n")
    assert len(rest.requests) == 1
    assert not (ssh_dir() / "id_ed25519").exists()

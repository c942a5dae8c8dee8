"""The runner's SSH host key: one ed25519 key per machine work dir, made on
first use and kept across runner restarts. Its public half goes to the
server in the Hello; the server hands it to the client with each grant, so
the client checks that it reached this runner (decision 0098-ssh-authentication)."""

from __future__ import annotations

import os
from pathlib import Path

import asyncssh

HOST_KEY_FILE = "ssh_host_ed25519_key"


def load_or_create_host_key(work_dir: Path) -> asyncssh.SSHKey:
    """The key in ``work_dir/ssh_host_ed25519_key`` (0600), made when missing.
    Written whole or not at all: runners starting together on one work dir
    keep the one that landed first."""
    path = work_dir / HOST_KEY_FILE
    if path.exists():
        return asyncssh.read_private_key(path)
    work_dir.mkdir(parents=True, exist_ok=True)
    key = asyncssh.generate_private_key("ssh-ed25519", comment="trainyard-runner")
    tmp = path.with_name(f"{HOST_KEY_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.export_private_key())
    try:
        os.link(tmp, path)  # fails if another runner got there first
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return asyncssh.read_private_key(path)


def public_line(key: asyncssh.SSHKey) -> str:
    """The OpenSSH line of the key's public half (what ``Hello.ssh_host_key`` carries)."""
    return key.export_public_key().decode().strip()

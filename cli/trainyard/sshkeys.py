"""SSH keys on this machine: the public keys ssh would offer (the default
``~/.ssh/id_*.pub``, the agent's, Trainyard's own), their fingerprints as
``ssh-keygen -l`` prints them, and Trainyard's own key
(``~/.config/trainyard/ssh/id_ed25519``), made on first use.

A private key is never read: a file whose ``.pub`` sits beside it is refused
by name, and a file that turns out to hold a private key is refused without
being sent anywhere.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .sshconfig import ssh_dir

DEFAULT_NAMES = ("id_ed25519", "id_ecdsa", "id_rsa")
MAX_PUBLIC_KEY_BYTES = 16 * 1024
AGENT_TIMEOUT = 5.0
KEYGEN_TIMEOUT = 30.0
_PRIVATE_MARKS = ("PRIVATE KEY", "PuTTY-User-Key-File")


class SshKeyError(Exception):
    """A key cannot be read or made; the message says what to do."""


@dataclass(frozen=True)
class LocalKey:
    line: str  # "<type> <base64> [comment]"
    fingerprint: str
    source: str  # a file's path, or "ssh-agent"


def fingerprint(line: str) -> str:
    """``SHA256:…`` of an OpenSSH public key line, as ``ssh-keygen -l`` prints it."""
    try:
        blob = base64.b64decode(line.split()[1], validate=True)
    except (IndexError, binascii.Error, ValueError):
        raise SshKeyError("this is not an OpenSSH public key line (<type> <base64> [comment])") from None
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def default_public_key() -> Path:
    """The first of ``~/.ssh/id_ed25519.pub``, ``id_ecdsa.pub``, ``id_rsa.pub`` that exists."""
    for name in DEFAULT_NAMES:
        path = Path.home() / ".ssh" / f"{name}.pub"
        if path.is_file():
            return path
    raise SshKeyError(
        "no public key in ~/.ssh (id_ed25519.pub, id_ecdsa.pub, id_rsa.pub): make one with "
        "`ssh-keygen -t ed25519`, or name the .pub file: trainyard ssh-key add PATH"
    )


def read_public_key(path: Path) -> str:
    """The one public key line of ``path``; refused, unsent, when it is a private key."""
    if path.suffix != ".pub" and path.with_name(path.name + ".pub").is_file():
        raise SshKeyError(f"{path} is a private key: add its public half, trainyard ssh-key add {path}.pub")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_PUBLIC_KEY_BYTES + 1)
    except OSError as e:
        raise SshKeyError(f"cannot read {path}: {e.strerror or e}") from None
    text = data.decode("utf-8", errors="replace")
    if any(mark in text for mark in _PRIVATE_MARKS):
        raise SshKeyError(f"{path} holds a PRIVATE key: it was not sent. Add the public key (the .pub file) instead.")
    if len(data) > MAX_PUBLIC_KEY_BYTES:
        raise SshKeyError(f"{path} is larger than {MAX_PUBLIC_KEY_BYTES // 1024} KiB: not a public key file")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(lines) != 1:
        raise SshKeyError(f"{path} holds {len(lines)} keys: name a file with one (a .pub file)")
    return lines[0]


def local_keys() -> list[LocalKey]:
    """The public keys ssh offers from this machine: the default files (with
    their private key beside them), Trainyard's own, and the agent's."""
    found = []
    files = [Path.home() / ".ssh" / name for name in DEFAULT_NAMES] + [trainyard_key()]
    for private in files:
        public = private.with_name(private.name + ".pub")
        if private.is_file() and public.is_file():
            try:
                line = read_public_key(public)
                found.append(LocalKey(line, fingerprint(line), str(public)))
            except SshKeyError:
                continue
    return found + _agent_keys()


def trainyard_key() -> Path:
    """Trainyard's own private key (its ``.pub`` beside it)."""
    return ssh_dir() / "id_ed25519"


def make_trainyard_key() -> LocalKey:
    """Makes ``trainyard_key()`` (ed25519, no passphrase, 0600) with the stock
    ``ssh-keygen``, else with ``cryptography`` when installed."""
    path = trainyard_key()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    comment = f"trainyard@{socket.gethostname()}"
    if shutil.which("ssh-keygen"):
        command = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=KEYGEN_TIMEOUT, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise SshKeyError(f"ssh-keygen could not make {path}: {done.stderr.strip()}")
    else:
        _make_with_cryptography(path, comment)
    line = read_public_key(path.with_name(path.name + ".pub"))
    return LocalKey(line, fingerprint(line), str(path) + ".pub")


def _make_with_cryptography(path: Path, comment: str) -> None:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:
        raise SshKeyError("ssh-keygen is not installed: install the openssh-client package (it has ssh too)") from None
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    path.with_name(path.name + ".pub").write_text(f"{public.decode()} {comment}\n")


def _agent_keys() -> list[LocalKey]:
    if not os.environ.get("SSH_AUTH_SOCK") or not shutil.which("ssh-add"):
        return []
    try:
        listed = subprocess.run(
            ["ssh-add", "-L"], capture_output=True, text=True, timeout=AGENT_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    keys = []
    for line in listed.stdout.splitlines() if listed.returncode == 0 else []:
        try:
            keys.append(LocalKey(line.strip(), fingerprint(line), "ssh-agent"))
        except SshKeyError:
            continue
    return keys

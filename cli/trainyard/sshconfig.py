"""The stock OpenSSH client's view of running jobs: ``Host`` entries in
``~/.config/trainyard/ssh/config`` (one per job, ``trainyard-<run>`` for a
run of one job, ``trainyard-<run>-<job>`` otherwise), reached through
``trainyard ssh-proxy`` as their ``ProxyCommand``, and one ``Include`` of that
file at the top of ``~/.ssh/config``, so ``ssh``, ``scp``, ``rsync`` and VS
Code's Remote-SSH reach a job by its host name.

Each entry checks the job's host key for real: ``trainyard ssh-proxy`` writes
the key the server vouches for to ``known_hosts/<alias>`` before it forwards
a byte, and the entry names that file with ``StrictHostKeyChecking yes``.

Host names of the default server and workspace are bare; another workspace's
carry its slug (``trainyard-<workspace>-<run>``), and another server's its
host too, so entries of several servers and workspaces never collide
(docs/decisions/0099-ssh-client.md). The file holds the entries of every
server and workspace; writing one scope's entries keeps the others'.

The user's own ``~/.ssh/config`` is never rewritten but for the one
``Include`` line (and its comment) put before its first line; a symlinked
file is written through its link.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .config import DEFAULT_URL, config_path, saved_login

MARK = "# trainyard-host"
INCLUDE_COMMENT = "# Added by trainyard: SSH into running jobs (trainyard ssh-config)."
SERVER_ALIVE_SECONDS = 15
# A host name is one ssh_config token, and scp reads "host:path": no spaces, quotes, "%" or ":".
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class SshConfigError(Exception):
    """The SSH configuration cannot be written; the message says what to do."""


@dataclass(frozen=True)
class Scope:
    """The server and workspace a host entry reaches."""

    url: str
    workspace: str


@dataclass(frozen=True)
class HostEntry:
    alias: str
    scope: Scope
    run: str
    job: str  # "" when the run has one job: the server picks it


def ssh_dir(env: dict[str, str] | None = None) -> Path:
    """``~/.config/trainyard/ssh`` (beside the CLI's own config, ``$XDG_CONFIG_HOME`` when set)."""
    return config_path(os.environ if env is None else env).parent / "ssh"


def host_alias(scope: Scope, run: str, job: str, *, default_workspace: str) -> str:
    """The host name of ``job`` of ``run`` (``job`` "": a one-job run)."""
    parts = ["trainyard", *_scope_parts(scope, default_workspace), run, *([job] if job else [])]
    return _UNSAFE.sub("-", "-".join(parts))


def known_hosts_file(alias: str) -> Path:
    return ssh_dir() / "known_hosts" / alias


def write_host_key(alias: str, host_key: str) -> Path:
    """``<alias> <host key>``: what ssh checks the job's host key against (``HostKeyAlias``)."""
    kind, _, rest = host_key.strip().partition(" ")
    blob = rest.split(" ")[0]
    if not kind or not blob or "\n" in host_key.strip():
        raise SshConfigError("the server sent no usable host key for this session")
    path = known_hosts_file(alias)
    _write_private(path, f"{alias} {kind} {blob}\n")
    return path


def write_entries(entries: Iterable[HostEntry], *, replace_scope: Scope | None = None, identity: Path | None) -> Path:
    """Upserts ``entries`` into the Trainyard SSH config; with
    ``replace_scope`` that scope's other entries go (runs no longer
    running). Then makes sure ``~/.ssh/config`` includes it. Returns the file."""
    path = ssh_dir() / "config"
    new = {entry.alias: entry for entry in entries}
    kept = [
        block
        for block in _blocks(path)
        if block.alias not in new and (replace_scope is None or block.scope != replace_scope)
    ]
    text = "".join(block.text for block in kept)
    text += "".join(_entry_text(entry, identity) for entry in sorted(new.values(), key=lambda e: e.alias))
    _write_private(path, _header() + text)
    include_in_user_config(path)
    return path


def include_in_user_config(path: Path) -> Path:
    """Puts ``Include <path>`` at the top of ``~/.ssh/config`` unless it is
    there already before any ``Host``/``Match`` (where it would apply to
    every host). Returns the user's file."""
    user_config = user_ssh_config()
    target = user_config.resolve() if user_config.is_symlink() else user_config
    try:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
    except (OSError, UnicodeDecodeError) as e:
        raise SshConfigError(f"cannot read {user_config}: {e}; add this line at its top: Include {path}") from None
    if _includes(current, path):
        return user_config
    include = f"{INCLUDE_COMMENT}\nInclude {_quoted(str(path))}\n\n"
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o600
        _write_atomic(target, include + current, mode)
    except OSError as e:
        raise SshConfigError(f"cannot write {user_config}: {e}; add this line at its top: Include {path}") from None
    return user_config


def ssh_reads_user_config_include(path: Path) -> bool:
    """Whether ssh, which finds ``~`` in the password database (not
    ``$HOME``), reads the Trainyard config through the user's file."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    try:
        return _includes((home / ".ssh" / "config").read_text(encoding="utf-8"), path)
    except (OSError, UnicodeDecodeError):
        return False


def user_ssh_config() -> Path:
    return Path.home() / ".ssh" / "config"


def proxy_command(entry: HostEntry) -> list[str]:
    """The command ssh runs to reach ``entry``'s job: this CLI, by the
    interpreter it runs in (VS Code's ssh may have another ``PATH``)."""
    job = ["--job", entry.job] if entry.job else []
    scope = ["--url", entry.scope.url, "--workspace", entry.scope.workspace]
    return [sys.executable, "-m", "trainyard", "ssh-proxy", entry.run, *job, *scope, "--alias", entry.alias]


# ------------------------------------------------------------------ private


@dataclass(frozen=True)
class _Block:
    alias: str
    scope: Scope | None
    text: str


def _scope_parts(scope: Scope, default_workspace: str) -> list[str]:
    login = saved_login()
    server_default = scope.url.rstrip("/") == (login.get("url") or DEFAULT_URL).rstrip("/") if login else True
    parts = [] if server_default else [_server_label(scope.url)]
    if not server_default or scope.workspace != (login.get("workspace") or default_workspace):
        parts.append(scope.workspace)
    return parts


def _server_label(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or 'server'}{f'-{parts.port}' if parts.port else ''}"


def _entry_text(entry: HostEntry, identity: Path | None) -> str:
    command = " ".join(shlex.quote(arg) for arg in proxy_command(entry)).replace("%", "%%")
    lines = [
        f"{MARK} url={entry.scope.url} workspace={entry.scope.workspace} run={entry.run} job={entry.job}",
        f"Host {entry.alias}",
        f"  ProxyCommand {command}",
        f"  HostKeyAlias {entry.alias}",
        f"  UserKnownHostsFile {_quoted(str(known_hosts_file(entry.alias)))}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  CheckHostIP no",
        f"  ServerAliveInterval {SERVER_ALIVE_SECONDS}",
        "  ServerAliveCountMax 4",
        *([f"  IdentityFile {_quoted(str(identity))}"] if identity is not None else []),
    ]
    return "\n".join(lines) + "\n\n"


def _header() -> str:
    return (
        "# Written by `trainyard ssh-config` and `trainyard ssh`: changes here are overwritten.\n"
        "# ~/.ssh/config includes this file; each host is one job of a running run.\n\n"
    )


def _blocks(path: Path) -> list[_Block]:
    """The entries of the Trainyard SSH config, each from its mark to the next."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise SshConfigError(f"cannot read {path}: {e}; delete it and run `trainyard ssh-config`") from None
    blocks = []
    for chunk in text.split(f"{MARK} ")[1:]:
        fields = dict(part.partition("=")[::2] for part in chunk.split("\n", 1)[0].split(" "))
        alias = re.search(r"^Host (\S+)$", chunk, re.MULTILINE)
        if alias is None:
            continue
        scope = Scope(fields.get("url", ""), fields.get("workspace", ""))
        blocks.append(_Block(alias.group(1), scope, f"{MARK} {chunk.rstrip()}\n\n"))
    return blocks


def _includes(text: str, path: Path) -> bool:
    """``Include <path>`` before the file's first ``Host`` or ``Match``."""
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote: not a line of ours
            continue
        if not words:
            continue
        keyword = words[0].split("=")[0].lower()
        if keyword in ("host", "match"):
            return False
        if keyword == "include" and str(path) in {os.path.expanduser(word) for word in words[1:]}:
            return True
    return False


def _quoted(value: str) -> str:
    return f'"{value}"' if " " in value else value


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write_atomic(path, text, 0o600)


def _write_atomic(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)

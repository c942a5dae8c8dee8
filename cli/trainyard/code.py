"""Shipping the user's code with a run.

Two ways, chosen by ``prepare_code``:

- **git** (a git repo with a remote, no ``--upload``): the remote URL, the
  commit at HEAD, and a binary patch of everything uncommitted, untracked
  files included (ignored files excluded). The runner clones the commit and
  runs ``git apply --binary`` on the patch. The patch is computed in a
  temporary index file, so the user's index (what they staged) is never
  touched.
- **archive** (no git, no remote, or ``--upload``): a tar.gz of the working
  tree. In a git repo that is tracked plus untracked-not-ignored files; outside
  one, every file except ``.git`` directories.

The archive is reproducible: the same tree gives the same bytes (sorted
entries, gzip and member mtimes 0, no owner names, modes 0644/0755 as git
keeps them), because the server's cache key includes its sha256 and
``run --dry-run`` sends only that digest (``code_digests``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIT_TIMEOUT = 120.0
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}
# Neutralise user config that would change the patch format; `git apply`
# needs a/ b/ prefixes (rename detection is fine, apply understands it).
_PLAIN_DIFF = ("-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false")


class CodeError(Exception):
    """The code could not be collected; the message says what failed."""


@dataclass(frozen=True)
class Workspace:
    """Where a run's code comes from: ``root`` and whether it is a git repo."""

    root: Path
    is_git: bool


def find_workspace(cwd: Path) -> Workspace:
    """The git top level containing ``cwd``, else ``cwd`` itself."""
    try:
        top = _git(cwd, "rev-parse", "--show-toplevel").decode().strip()
    except CodeError:
        return Workspace(root=cwd.resolve(), is_git=False)
    return Workspace(root=Path(top), is_git=True)


def remote_url(root: Path) -> str | None:
    """The URL of ``origin``, else of the first remote; None without remotes."""
    remotes = _git(root, "remote").decode().split()
    if not remotes:
        return None
    name = "origin" if "origin" in remotes else remotes[0]
    return _git(root, "remote", "get-url", name).decode().strip() or None


def head_commit(root: Path) -> str | None:
    """The commit at HEAD, or None in a repo without commits."""
    try:
        return _git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}").decode().strip()
    except CodeError:
        return None


def is_pushed(root: Path, commit: str) -> bool:
    """Whether a remote-tracking branch this clone knows contains ``commit``."""
    return bool(_git(root, "branch", "-r", "--contains", commit).strip())


def git_patch(root: Path) -> bytes:
    """A binary patch from HEAD to the working tree (untracked, not ignored
    files included), made without touching the user's index:

    1. read HEAD into a temporary index file;
    2. ``git add -A`` into that index (honours .gitignore);
    3. diff that index against HEAD.
    """
    with tempfile.TemporaryDirectory(prefix="trainyard-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(root, "read-tree", "HEAD", env=env)
        _git(root, "add", "-A", env=env)
        return _git(
            root,
            *_PLAIN_DIFF,
            "diff",
            "--cached",
            "--binary",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "HEAD",
            env=env,
        )


def archive_files(workspace: Workspace) -> list[str]:
    """Relative paths that go into the archive, sorted."""
    if workspace.is_git:
        out = _git(workspace.root, "ls-files", "-co", "--exclude-standard", "-z")
        names = {n for n in out.decode("utf-8", "surrogateescape").split("\0") if n}
        # a tracked file deleted from the working tree is listed but absent
        return sorted(n for n in names if os.path.lexists(workspace.root / n))
    found: list[str] = []
    for directory, dirs, files in os.walk(workspace.root):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        rel = Path(directory).relative_to(workspace.root)
        found.extend(str(rel / f) if str(rel) != "." else f for f in files)
    return sorted(found)


def make_archive(workspace: Workspace, dest: Path) -> int:
    """Write the reproducible tar.gz of the working tree to ``dest``; returns
    the file count."""
    names = archive_files(workspace)
    # gzip's header carries a file name and mtime: neither goes in.
    with (
        dest.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in names:
            info = _normalised(tar.gettarinfo(workspace.root / name, arcname=name))
            if info.isreg():
                with (workspace.root / name).open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return len(names)


def prepare_code(
    workspace: Workspace, *, force_upload: bool, upload_blob: Callable[[bytes | Path], Any], warn: Callable[[str], None]
) -> dict[str, Any]:
    """The ``code`` object of a new run, uploading a patch or archive blob."""
    git = _git_source(workspace, force_upload=force_upload, warn=warn)
    if git is not None:
        url, commit, patch = git
        blob = upload_blob(patch) if patch else None
        return {"kind": "git", "repo_url": url, "commit": commit, "patch_blob": blob["id"] if blob else None}
    with tempfile.TemporaryDirectory(prefix="trainyard-code-") as tmp:
        archive = Path(tmp) / "code.tar.gz"
        make_archive(workspace, archive)
        blob = upload_blob(archive)
    return {"kind": "archive", "archive_blob": blob["id"]}


def code_digests(workspace: Workspace, *, force_upload: bool, warn: Callable[[str], None]) -> dict[str, Any]:
    """The ``code`` object of a run plan: what ``prepare_code`` would send,
    with the sha256 of the patch (``patch_sha256``, left out without a patch)
    or archive (``archive_sha256``) in place of an uploaded blob."""
    git = _git_source(workspace, force_upload=force_upload, warn=warn)
    if git is not None:
        url, commit, patch = git
        return {"kind": "git", "repo_url": url, "commit": commit} | (
            {"patch_sha256": hashlib.sha256(patch).hexdigest()} if patch else {}
        )
    with tempfile.TemporaryDirectory(prefix="trainyard-code-") as tmp:
        archive = Path(tmp) / "code.tar.gz"
        make_archive(workspace, archive)
        return {"kind": "archive", "archive_sha256": file_sha256(archive)}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _git_source(
    workspace: Workspace, *, force_upload: bool, warn: Callable[[str], None]
) -> tuple[str, str, bytes] | None:
    """(remote URL, commit, patch) when the code goes by git, else None."""
    url = remote_url(workspace.root) if workspace.is_git and not force_upload else None
    commit = head_commit(workspace.root) if url else None
    if not (url and commit):
        return None
    if not is_pushed(workspace.root, commit):
        warn(
            f"commit {commit[:12]} is on no remote branch this clone knows: "
            "push it, or the runner cannot fetch it (or use --upload)"
        )
    return url, commit, git_patch(workspace.root)


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Only what git would keep: no times, owners or group/other bits."""
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if not info.issym():
        info.mode = 0o755 if info.mode & 0o111 else 0o644
    return info


def _git(root: Path, *args: str, env: dict[str, str] | None = None) -> bytes:
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **_GIT_ENV, **(env or {})},
            timeout=GIT_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise CodeError(
            "git is not installed; install it, or run from a directory that is not a git repository"
        ) from None
    except subprocess.TimeoutExpired:
        raise CodeError(f"git {args[0]} took more than {GIT_TIMEOUT:.0f}s") from None
    if proc.returncode != 0:
        detail = proc.stderr.decode("utf-8", "replace").strip()
        raise CodeError(f"git {' '.join(args)} failed: {detail}")
    return proc.stdout

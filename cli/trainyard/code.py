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

``.trainyardignore`` (also read: ``.dstackignore``) at the top of the
working tree leaves more untracked files out of both, in gitignore syntax.
In a git repo git itself applies it, as if its lines were in the user's
global excludes file (so .gitignore's rules come first, and tracked files
ship whatever it says); outside git, ``pathspec`` applies it to every file.

Before building either, ``prepare_code`` lists what it will ship beyond the
commit (``Shipment``) and hands it to a ``SizeCheck``, then the built blob's
size: the CLI's size guard (guard.py) may stop the run there, before any byte
is uploaded.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import pathspec

GIT_TIMEOUT = 120.0
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}
# Neutralise user config that would change the patch format; `git apply`
# needs a/ b/ prefixes (rename detection is fine, apply understands it).
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<userinfo>[^/?#]*)@")
_PLAIN_DIFF = ("-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false")
IGNORE_FILES = (".trainyardignore", ".dstackignore")
ARCHIVE_FILES_NAMED = 10_000  # the server's limit on a code's patch_files


class CodeError(Exception):
    """The code could not be collected; the message says what failed."""


@dataclass(frozen=True)
class ShippedFile:
    path: str  # relative to the working tree's top, with /
    size: int  # bytes on disk (0 for a deleted file or a nested repository)


@dataclass(frozen=True)
class Shipment:
    """What a run ships beyond its commit: the uncommitted and untracked
    files of its patch (``kind="patch"``), or every file of its archive."""

    kind: Literal["patch", "archive"]
    files: tuple[ShippedFile, ...]

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    def largest(self, count: int) -> list[ShippedFile]:
        return sorted(self.files, key=lambda f: (-f.size, f.path))[:count]


class SizeCheck(Protocol):
    """Told what is about to ship; raises (a ``CodeError``) to stop before the upload."""

    def before_build(self, shipment: Shipment) -> None:
        """Called with the files, before the patch or archive is built."""

    def built(self, shipment: Shipment, blob_bytes: int) -> None:
        """Called with the size of the built patch or archive, before it is uploaded."""


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


def url_without_credentials(url: str) -> str:
    """``url`` without the ``user:password@`` / ``token@`` it may carry (an SSH URL keeps its user name)."""
    match = _USERINFO.match(url)
    if match is None:
        return url
    user = match["userinfo"].split(":", 1)[0]
    kept = f"{user}@" if match["scheme"].lower() in {"ssh", "git+ssh", "ssh+git"} and user else ""
    return f"{match['scheme']}://{kept}{url[match.end() :]}"


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
    2. ``git add -A`` into that index (honours .gitignore and .trainyardignore);
    3. diff that index against HEAD.
    """
    with tempfile.TemporaryDirectory(prefix="trainyard-index-") as tmp, _excludes(root) as excludes:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(root, "read-tree", "HEAD", env=env)
        _git(root, *excludes, "add", "-A", env=env)
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


def patch_shipment(root: Path) -> Shipment:
    """The files ``git_patch`` would carry, with their sizes, read without
    building it: tracked files that differ from HEAD (``git diff HEAD``; the
    user's index is only read) and untracked, not ignored ones."""
    changed = _names(_git(root, "diff", "--name-only", "--no-renames", "-z", "HEAD"))
    with _excludes(root) as excludes:
        untracked = _names(_git(root, *excludes, "ls-files", "--others", "--exclude-standard", "-z"))
    return Shipment(kind="patch", files=_sized(root, sorted(set(changed) | set(untracked))))


def archive_shipment(workspace: Workspace) -> Shipment:
    return Shipment(kind="archive", files=_sized(workspace.root, archive_files(workspace)))


def archive_files(workspace: Workspace) -> list[str]:
    """Relative paths that go into the archive, sorted."""
    if workspace.is_git:
        with _excludes(workspace.root) as excludes:
            out = _git(workspace.root, *excludes, "ls-files", "-co", "--exclude-standard", "-z")
        # a tracked file deleted from the working tree is listed but absent
        return sorted(n for n in set(_names(out)) if os.path.lexists(workspace.root / n))
    ignored = _ignore_spec(workspace.root)
    found: list[str] = []
    for directory, dirs, files in os.walk(workspace.root):
        rel = Path(directory).relative_to(workspace.root).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        dirs[:] = sorted(d for d in dirs if d != ".git" and not ignored.match_file(f"{prefix}{d}/"))
        found.extend(f"{prefix}{f}" for f in files if not ignored.match_file(f"{prefix}{f}"))
    return sorted(found)


def make_archive(workspace: Workspace, dest: Path, names: list[str] | None = None) -> int:
    """Write the reproducible tar.gz of the working tree (or of ``names`` in
    it) to ``dest``; returns the file count."""
    names = archive_files(workspace) if names is None else names
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
    workspace: Workspace,
    *,
    force_upload: bool,
    upload_blob: Callable[[bytes | Path], Any],
    warn: Callable[[str], None],
    check: SizeCheck | None = None,
) -> dict[str, Any]:
    """The ``code`` object of a new run, uploading a patch or archive blob
    (after ``check`` let it through)."""
    git = _git_source(workspace, force_upload=force_upload, warn=warn)
    if git is not None:
        url, commit = git
        patch = _checked_patch(workspace.root, check)
        blob = upload_blob(patch) if patch else None
        code = {"kind": "git", "repo_url": url, "commit": commit, "patch_blob": blob["id"] if blob else None}
        return code | ({"patch_files": patch_files(patch)} if patch else {})
    with _checked_archive(workspace, check) as (archive, files):
        blob = upload_blob(archive)
    return {"kind": "archive", "archive_blob": blob["id"]} | ({"patch_files": files} if files is not None else {})


def code_digests(
    workspace: Workspace, *, force_upload: bool, warn: Callable[[str], None], check: SizeCheck | None = None
) -> dict[str, Any]:
    """The ``code`` object of a run plan: what ``prepare_code`` would send,
    with the sha256 of the patch (``patch_sha256``, left out without a patch)
    or archive (``archive_sha256``) in place of an uploaded blob."""
    git = _git_source(workspace, force_upload=force_upload, warn=warn)
    if git is not None:
        url, commit = git
        patch = _checked_patch(workspace.root, check)
        return {"kind": "git", "repo_url": url, "commit": commit} | (
            {"patch_sha256": hashlib.sha256(patch).hexdigest(), "patch_files": patch_files(patch)} if patch else {}
        )
    with _checked_archive(workspace, check) as (archive, files):
        digests = {"kind": "archive", "archive_sha256": file_sha256(archive)}
        return digests | ({"patch_files": files} if files is not None else {})


def keep_out_of_git(out_root: Path, written: list[Path]) -> tuple[Path, list[str]] | None:
    """Make git ignore the files the CLI wrote (``written``, under
    ``out_root``) through the repo's ``info/exclude``, so they change no later
    run's code. Returns the exclude file and the lines added (none when git
    already ignores them); None when ``out_root`` is in no git working tree.

    1. A file is covered by ``out_root`` when that lies inside the working
       tree, else by its first directory below the top (or by itself when it
       sits at the top);
    2. a cover that holds any file the CLI did not just write (tracked or
       untracked: the user's) is not excluded, the file itself is;
    3. covers git already ignores are skipped; the rest are appended, once.
    """
    try:
        top = Path(_git(_existing(out_root), "rev-parse", "--show-toplevel").decode().strip()).resolve()
    except CodeError:
        return None
    files = [f.resolve() for f in written if f.resolve().is_relative_to(top) and f.resolve() != top]
    ours = {f.relative_to(top).as_posix() for f in files}
    only_ours: dict[Path, bool] = {}
    covers: dict[Path, None] = {}
    for file in files:
        cover = _cover(top, out_root.resolve(), file)
        if cover not in only_ours:
            only_ours[cover] = cover == file or set(_names(_git(top, *_LIST_SEEN, "--", str(cover)))) <= ours
        covers[cover if only_ours[cover] else file] = None
    wanted = [_exclude_line(top, c) for c in covers if not _is_ignored(top, c)]
    exclude = Path(_git(top, "rev-parse", "--git-path", "info/exclude").decode().strip())
    exclude = exclude if exclude.is_absolute() else top / exclude
    existing = exclude.read_text(encoding="utf-8", errors="replace").splitlines() if exclude.exists() else []
    added = [line for line in dict.fromkeys(wanted) if line not in existing]
    if added:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        separator = "\n" if existing and exclude.read_bytes()[-1:] != b"\n" else ""
        header = [] if _DOWNLOADS_HEADER in existing else [_DOWNLOADS_HEADER]
        with exclude.open("a", encoding="utf-8") as f:
            f.write(separator + "\n".join([*header, *added]) + "\n")
    return exclude, added


def patch_files(patch: bytes) -> dict[str, str]:
    """{path: sha256 of its part of the patch} for each file a git patch
    touches: the server names the files two runs' patches differ in (a
    cache decision's "code changed (make_data.py)") without the patches."""
    parts: dict[str, list[bytes]] = {}
    current: list[bytes] | None = None
    for line in patch.splitlines(keepends=True):
        if line.startswith(b"diff --git "):
            current = parts.setdefault(_diff_path(line), [])
        if current is not None:
            current.append(line)
    return {path: hashlib.sha256(b"".join(lines)).hexdigest() for path, lines in parts.items()}


def _diff_path(header: bytes) -> str:
    """The path of ``diff --git a/<path> b/<path>`` (the new one of a rename;
    a name git quotes is kept as written)."""
    text = header.decode("utf-8", "surrogateescape").rstrip("\n")[len("diff --git ") :]
    half = len(text) // 2  # "a/P b/P" has the space in the middle
    if text[half : half + 1] == " " and text[2:half] == text[half + 3 :]:
        return text[half + 3 :]
    return text.split(" b/", 1)[-1]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _checked_patch(root: Path, check: SizeCheck | None) -> bytes:
    shipment = patch_shipment(root)
    if check is not None:
        check.before_build(shipment)
    patch = git_patch(root)
    if check is not None:
        check.built(shipment, len(patch))
    return patch


@contextmanager
def _checked_archive(workspace: Workspace, check: SizeCheck | None) -> Iterator[tuple[Path, dict[str, str] | None]]:
    """The built archive and its files' digests (``archive_file_digests``)."""
    shipment = archive_shipment(workspace)
    if check is not None:
        check.before_build(shipment)
    names = [f.path for f in shipment.files]
    with tempfile.TemporaryDirectory(prefix="trainyard-code-") as tmp:
        archive = Path(tmp) / "code.tar.gz"
        make_archive(workspace, archive, names)
        if check is not None:
            check.built(shipment, archive.stat().st_size)
        yield archive, archive_file_digests(workspace.root, names)


def archive_file_digests(root: Path, names: list[str]) -> dict[str, str] | None:
    """{path: sha256 of its mode and bytes (a link: its target)} for each file
    of an archive: the server names the files two runs' archives differ in (a
    cache decision's "code changed (make_data.py)"), as ``patch_files`` does
    for a patch. None past the server's limit of ``ARCHIVE_FILES_NAMED``
    paths: the decision then names the two archives."""
    if len(names) > ARCHIVE_FILES_NAMED:
        return None
    digests = {}
    for name in names:
        path = root / name
        digest = hashlib.sha256()
        if path.is_symlink():
            digest.update(b"link\0" + os.fsencode(os.readlink(path)))
        else:
            digest.update(f"{path.stat().st_mode & 0o777:o}\0".encode())
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
        digests[name] = digest.hexdigest()
    return digests


def _git_source(workspace: Workspace, *, force_upload: bool, warn: Callable[[str], None]) -> tuple[str, str] | None:
    """(remote URL, commit) when the code goes by git, else None."""
    url = remote_url(workspace.root) if workspace.is_git and not force_upload else None
    commit = head_commit(workspace.root) if url else None
    if not (url and commit):
        return None
    if (shown := url_without_credentials(url)) != url:
        warn(
            "the remote's URL carries a credential: it is not sent (a run's URL is visible to the whole workspace);"
            " for a private repository set a clone credential once: trainyard repo credential set --https-token"
        )
        url = shown
    if not is_pushed(workspace.root, commit):
        warn(
            f"commit {commit[:12]} is on no remote branch this clone knows: "
            "push it, or the runner cannot fetch it (or use --upload)"
        )
    return url, commit


# What git sees in a directory: tracked files and untracked ones it does not ignore.
_LIST_SEEN = ("ls-files", "-z", "--cached", "--others", "--exclude-standard")
_DOWNLOADS_HEADER = "# written by trainyard (downloads): not part of a run's code"


@contextmanager
def _excludes(root: Path) -> Iterator[tuple[str, ...]]:
    """Git options that add the root's ignore files to what git ignores.

    They go in as the global excludes file (the user's own first, then
    .trainyardignore, then .dstackignore): git then applies them with its own
    matching, after .gitignore and .git/info/exclude, to untracked files only.
    No ignore file, no options: git behaves exactly as for the user.
    """
    ours = [root / name for name in IGNORE_FILES if (root / name).is_file()]
    if not ours:
        yield ()
        return
    sources = [p for p in [_global_excludes(root)] if p is not None and p.is_file()] + ours
    with tempfile.TemporaryDirectory(prefix="trainyard-ignore-") as tmp:
        combined = Path(tmp) / "ignore"
        combined.write_bytes(b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in sources))
        yield ("-c", f"core.excludesFile={combined}")


def _global_excludes(root: Path) -> Path | None:
    """The user's global excludes file: core.excludesFile, else git's default."""
    try:
        configured = _git(root, "config", "--path", "--get", "core.excludesFile").decode().strip()
    except CodeError:  # unset: git exits 1
        configured = ""
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "git" / "ignore"


def _ignore_spec(root: Path) -> pathspec.GitIgnoreSpec:
    lines: list[str] = []
    for name in IGNORE_FILES:
        if (root / name).is_file():
            lines += (root / name).read_text(encoding="utf-8", errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _names(out: bytes) -> list[str]:
    return [n for n in out.decode("utf-8", "surrogateescape").split("\0") if n]


def _sized(root: Path, names: list[str]) -> tuple[ShippedFile, ...]:
    """Each name with its size on disk: 0 for a deleted file or a directory
    (a nested repository ships as a commit id)."""
    files = []
    for name in names:
        try:
            stat = os.lstat(root / name)
        except FileNotFoundError:
            files.append(ShippedFile(name, 0))
            continue
        files.append(ShippedFile(name, stat.st_size if not os.path.isdir(root / name) else 0))
    return tuple(files)


def _existing(path: Path) -> Path:
    path = path.resolve()
    while not path.is_dir():
        path = path.parent
    return path


def _cover(top: Path, out_root: Path, file: Path) -> Path:
    """Step 1 of ``keep_out_of_git``: the directory that may be excluded for ``file`` (inside ``top``)."""
    if out_root.is_relative_to(top) and out_root != top and file.is_relative_to(out_root):
        return out_root
    return top / file.relative_to(top).parts[0]


def _is_ignored(top: Path, path: Path) -> bool:
    try:
        _git(top, "check-ignore", "-q", "--", str(path.resolve()))
    except CodeError:  # exit 1: not ignored
        return False
    return True


def _exclude_line(top: Path, path: Path) -> str:
    """A gitignore line matching exactly ``path``: anchored at the top (so a
    leading # or ! is a plain character), a directory ending with /,
    wildcards and trailing spaces escaped."""
    rel = path.resolve().relative_to(top).as_posix()
    escaped = re.sub(r"([*?\[\\])", r"\\\1", rel)
    escaped = escaped.rstrip(" ") + "\\ " * (len(escaped) - len(escaped.rstrip(" ")))
    return "/" + escaped + ("/" if path.is_dir() else "")


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

"""Getting a job's code into its working directory.

git: a bare mirror per repository URL is kept under ``<work-dir>/git-cache``
and fetched only when the commit is missing; the working copy is a
``--shared`` clone of the mirror (no object copies), so a warm runner checks
out in milliseconds. archive: a tar.gz downloaded and extracted safely. A
download link refused with 403 (expired) is replaced by a fresh one.
Every failure raises ``CodeError`` with a reason fit for the job's state.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from .http import HttpError, download
from .protocol import CodeSpec

GIT_TIMEOUT = 600.0  # a first clone of a large repository can take minutes
LOCAL_GIT_TIMEOUT = 60.0
MAX_FRESH_URLS = 3
# "archive" or "patch" -> a fresh signed URL for it (blocking).
FreshUrl = Callable[[str], str]
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}


class CodeError(Exception):
    """The code could not be prepared; the message says what failed."""


async def prepare_code(
    code: CodeSpec, *, work: Path, cache_dir: Path, tmp_dir: Path, fresh_url: FreshUrl | None = None
) -> None:
    """Fill the (not yet existing) directory ``work`` with the job's code;
    ``fresh_url`` replaces a download link refused with 403."""
    if code.kind == "git":
        await _prepare_git(code, work=work, cache_dir=cache_dir, tmp_dir=tmp_dir, fresh_url=fresh_url)
    else:
        await _prepare_archive(code, work=work, tmp_dir=tmp_dir, fresh_url=fresh_url)


def mirror_path(cache_dir: Path, repo_url: str) -> Path:
    return cache_dir / hashlib.sha256(repo_url.encode()).hexdigest()[:16]


def safe_extract(archive: Path, dest: Path) -> None:
    """Extract a tar.gz into ``dest``, refusing absolute paths and ``..``
    (checked explicitly, then again by tarfile's ``data`` filter)."""
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            name = PurePosixPath(member.name)
            if name.is_absolute() or ".." in name.parts:
                raise CodeError(f"archive member {member.name!r} points outside the working directory")
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as e:
            raise CodeError(f"archive refused: {e}") from e


# ---------------------------------------------------------------- git


async def _prepare_git(
    code: CodeSpec, *, work: Path, cache_dir: Path, tmp_dir: Path, fresh_url: FreshUrl | None = None
) -> None:
    """1. make the mirror if there is none, 2. shared clone of it, 3. checkout
    the commit, fetching the mirror first if it lacks the commit, 4. apply
    the patch if there is one. The warm path is two quick local git calls."""
    if not code.repo_url or not code.commit:
        raise CodeError("git code needs repo_url and commit")
    mirror = mirror_path(cache_dir, code.repo_url)
    if not mirror.exists():
        await _make_mirror(mirror, code.repo_url)
    await _git("clone", "--shared", "--no-checkout", "-q", str(mirror), str(work), what="clone from cache")
    checkout = ["-C", str(work), "checkout", "-q", code.commit]
    if (await _run(["git", *checkout], LOCAL_GIT_TIMEOUT))[0] != 0:
        # The work tree borrows the mirror's objects (alternates), so a fetch
        # into the mirror is enough for the commit to become visible here.
        await _fetch(mirror, code.repo_url, code.commit)
        await _git(*checkout, what=f"checkout {code.commit}")
    if code.patch_url:
        patch = tmp_dir / "code.patch"
        await _download(code.patch_url, patch, what="patch", fresh_url=fresh_url)
        if patch.stat().st_size:
            await _git("-C", str(work), "apply", "--binary", str(patch), what="git apply of the patch")


async def _make_mirror(mirror: Path, url: str) -> None:
    mirror.parent.mkdir(parents=True, exist_ok=True)
    partial = mirror.with_name(mirror.name + ".partial")
    await _rmtree(partial)
    await _git("clone", "--mirror", "-q", url, str(partial), what=f"clone of {url}", timeout=GIT_TIMEOUT)
    os.rename(partial, mirror)  # atomic: a half-made mirror is never used


async def _fetch(mirror: Path, url: str, commit: str) -> None:
    await _git("-C", str(mirror), "fetch", "-q", "--prune", "origin", what=f"fetch of {url}", timeout=GIT_TIMEOUT)
    if not await _has_commit(mirror, commit):
        raise CodeError(f"commit {commit} not found in {url}")


async def _has_commit(mirror: Path, commit: str) -> bool:
    code, _ = await _run(["git", "-C", str(mirror), "cat-file", "-e", f"{commit}^{{commit}}"], LOCAL_GIT_TIMEOUT)
    return code == 0


async def _git(*args: str, what: str, timeout: float = LOCAL_GIT_TIMEOUT) -> None:
    code, err = await _run(["git", *args], timeout)
    if code != 0:
        tail = err.strip()[-2000:]
        raise CodeError(f"{what} failed (exit {code}): {tail}" if tail else f"{what} failed (exit {code})")


async def _run(argv: list[str], timeout: float) -> tuple[int, str]:
    """Run a command; returns (exit code, stderr). A timeout kills it."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **_GIT_ENV},
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        raise CodeError(f"{' '.join(argv[:3])} timed out after {timeout:.0f}s") from None
    finally:
        if proc.returncode is None:  # timed out or the job was cancelled
            proc.kill()
            await asyncio.shield(proc.wait())
    return proc.returncode or 0, err.decode("utf-8", errors="replace")


# ---------------------------------------------------------------- archive


async def _prepare_archive(code: CodeSpec, *, work: Path, tmp_dir: Path, fresh_url: FreshUrl | None = None) -> None:
    if not code.archive_url:
        raise CodeError("archive code needs archive_url")
    archive = tmp_dir / "code.tar.gz"
    await _download(code.archive_url, archive, what="archive", fresh_url=fresh_url)
    work.mkdir(parents=True)
    try:
        await asyncio.to_thread(safe_extract, archive, work)
    except (tarfile.TarError, OSError) as e:
        raise CodeError(f"archive could not be extracted: {e}") from e


async def _download(url: str, dest: Path, *, what: str, fresh_url: FreshUrl | None = None) -> None:
    for asked in range(MAX_FRESH_URLS + 1):
        try:
            await asyncio.to_thread(download, url, dest)
            return
        except HttpError as e:
            if e.status != 403 or fresh_url is None or asked == MAX_FRESH_URLS:
                raise CodeError(f"download of the {what} failed: {e}") from e
        except OSError as e:
            raise CodeError(f"download of the {what} failed: {e}") from e
        try:
            url = await asyncio.to_thread(fresh_url, what)
        except (HttpError, OSError) as e:
            raise CodeError(f"download of the {what} failed: the link expired and no fresh one came: {e}") from e


async def _rmtree(path: Path) -> None:
    if path.exists():
        await asyncio.to_thread(shutil.rmtree, path, True)

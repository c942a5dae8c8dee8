"""Getting a job's code into its working directory.

git: a bare mirror per repository URL is kept under ``<work-dir>/git-cache``
and fetched only when the commit is missing; the working copy is a
``--shared`` clone of the mirror (no object copies). Beside each mirror the
runner keeps one such clone made ahead (``<mirror>.spare``, by
``spare_checkout`` once a job has ended): the next job of the repository
takes it with a rename and only checks its commit out, so a warm runner
starts a job without a clone. archive: a tar.gz downloaded and extracted safely. A
download link refused with 403 (expired) is replaced by a fresh one.
Every failure raises ``CodeError`` with a reason fit for the job's state.

A private repository's credential (``CodeSpec.credential``) reaches git only
through the environment of the clone and fetch, never a command line or a
URL: a token as an ``http.<origin>/.extraHeader`` (``GIT_CONFIG_COUNT``,
``GIT_CONFIG_KEY_0``, ``GIT_CONFIG_VALUE_0``), a key as a 0600 file in the
job's ``tmp/`` named by ``GIT_SSH_COMMAND`` and deleted once git is done.
Error messages never hold it (``_Auth.scrub``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import re
import secrets
import shlex
import shutil
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from .http import HttpError, download
from .process import runner_env
from .protocol import CodeSpec, GitCredential
from .retry import Backoff

log = logging.getLogger(__name__)

GIT_TIMEOUT = 600.0  # a first clone of a large repository can take minutes
LOCAL_GIT_TIMEOUT = 60.0
MAX_FRESH_URLS = 3
# "archive" or "patch" -> a fresh signed URL for it (blocking).
FreshUrl = Callable[[str], str]
# No prompts; and only the transports a repo URL means (not ext:: or fd::,
# which run commands).
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "GIT_ALLOW_PROTOCOL": "file:git:http:https:ssh"}
# A commit is a full or abbreviated object name, never an option.
_COMMIT = re.compile(r"[0-9a-fA-F]{7,64}")
# The username sent with a token when the credential names none (GitHub's
# convention; GitLab and most others accept any name with a token).
DEFAULT_TOKEN_USERNAME = "x-access-token"
# What git (and ssh) print when a remote wants a credential or refused one.
_AUTH_FAILURES = (
    "authentication failed",
    "could not read username",
    "could not read password",
    "terminal prompts disabled",
    "permission denied (publickey",
    "returned error: 401",
    "returned error: 403",
    "http basic: access denied",
    "invalid username or password",
    "repository not found",
)


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
    if not _COMMIT.fullmatch(code.commit):
        raise CodeError(f"commit {code.commit!r} is not a git object name (7 to 64 hex digits)")
    if code.repo_url.startswith("-"):
        raise CodeError(f"repository URL {code.repo_url!r} starts with '-'")
    mirror = mirror_path(cache_dir, code.repo_url)
    with _auth(code, tmp_dir) as auth:
        if not mirror.exists():
            await _make_mirror(mirror, code.repo_url, auth)
        if not _take_spare(mirror, work):
            await _git("clone", "--shared", "--no-checkout", "-q", str(mirror), str(work), what="clone from cache")
        checkout = ["-C", str(work), "checkout", "-q", code.commit]
        if (await _run(["git", *checkout], LOCAL_GIT_TIMEOUT))[0] != 0:
            # The work tree borrows the mirror's objects (alternates), so a fetch
            # into the mirror is enough for the commit to become visible here.
            await _fetch(mirror, code.repo_url, code.commit, auth)
            await _git(*checkout, what=f"checkout {code.commit}")
    if code.patch_url:
        patch = tmp_dir / "code.patch"
        await _download(code.patch_url, patch, what="patch", fresh_url=fresh_url)
        if patch.stat().st_size:
            await _git("-C", str(work), "apply", "--binary", str(patch), what="git apply of the patch")


def spare_path(mirror: Path) -> Path:
    return mirror.with_name(mirror.name + ".spare")


def _take_spare(mirror: Path, work: Path) -> bool:
    """Move the mirror's spare clone to ``work``; False when there is none
    (another job took it, or none was made yet)."""
    try:
        os.rename(spare_path(mirror), work)
    except OSError:
        return False
    return True


async def spare_checkout(code: CodeSpec, *, cache_dir: Path) -> None:
    """Make the spare clone of ``code``'s repository for the next job, if its
    mirror exists and it has none. Never raises: without a spare the next job
    clones from the mirror."""
    if code.kind != "git" or not code.repo_url:
        return
    mirror = mirror_path(cache_dir, code.repo_url)
    spare = spare_path(mirror)
    if not mirror.is_dir() or spare.exists():
        return
    partial = mirror.with_name(f"{mirror.name}.spare-{os.getpid()}-{secrets.token_hex(4)}.partial")
    try:
        await _git("clone", "--shared", "--no-checkout", "-q", str(mirror), str(partial), what="spare clone")
        os.rename(partial, spare)  # atomic; fails when another spare appeared meanwhile
    except (CodeError, OSError) as e:
        log.debug("no spare clone of %s: %s", code.repo_url, e)
    finally:
        await _rmtree(partial)


async def _make_mirror(mirror: Path, url: str, auth: _Auth) -> None:
    mirror.parent.mkdir(parents=True, exist_ok=True)
    partial = mirror.with_name(mirror.name + ".partial")
    await _rmtree(partial)
    await _git(
        "clone",
        "--mirror",
        "-q",
        "--",
        url,
        str(partial),
        what=f"clone of {url}",
        timeout=GIT_TIMEOUT,
        auth=auth,
        url=url,
    )
    os.rename(partial, mirror)  # atomic: a half-made mirror is never used


async def _fetch(mirror: Path, url: str, commit: str, auth: _Auth) -> None:
    fetch = ["-C", str(mirror), "fetch", "-q", "--prune", "origin"]
    await _git(*fetch, what=f"fetch of {url}", timeout=GIT_TIMEOUT, auth=auth, url=url)
    if not await _has_commit(mirror, commit):
        raise CodeError(f"commit {commit} not found in {url}")


async def _has_commit(mirror: Path, commit: str) -> bool:
    code, _ = await _run(["git", "-C", str(mirror), "cat-file", "-e", f"{commit}^{{commit}}"], LOCAL_GIT_TIMEOUT)
    return code == 0


async def _git(
    *args: str, what: str, timeout: float = LOCAL_GIT_TIMEOUT, auth: _Auth | None = None, url: str = ""
) -> None:
    """``auth``: a call that talks to the remote, with the credential's
    environment; a refusal is then explained in words, not in git's."""
    code, err = await _run(["git", *args], timeout, env=auth.env if auth else None)
    if code == 0:
        return
    if auth is not None:
        err = auth.scrub(err)
        if any(marker in err.lower() for marker in _AUTH_FAILURES):
            raise CodeError(_refused(url, auth, err))
    tail = err.strip()[-2000:]
    raise CodeError(f"{what} failed (exit {code}): {tail}" if tail else f"{what} failed (exit {code})")


async def _run(argv: list[str], timeout: float, *, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a command; returns (exit code, stderr). A timeout kills it."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**runner_env(), **_GIT_ENV, **(env or {})},  # never the runner's token
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


# ---------------------------------------------------------------- credentials


@dataclass(frozen=True)
class _Auth:
    """The environment git authenticates with, and what no message may show."""

    env: dict[str, str] = field(default_factory=dict)
    hidden: tuple[str, ...] = ()
    kind: str = ""  # "" without a credential

    def scrub(self, text: str) -> str:
        for secret in self.hidden:
            text = text.replace(secret, "*****")
        return text


@contextlib.contextmanager
def _auth(code: CodeSpec, tmp_dir: Path) -> Iterator[_Auth]:
    credential = code.credential
    if credential is None:
        yield _Auth()
    elif credential.kind == "https-token":
        yield _token_auth(code.repo_url, credential)
    else:
        with _key_auth(credential, tmp_dir) as auth:
            yield auth


def _token_auth(url: str, credential: GitCredential) -> _Auth:
    """HTTP Basic for this origin only (not for a submodule on another host)."""
    pair = f"{credential.username or DEFAULT_TOKEN_USERNAME}:{credential.secret}"
    basic = base64.b64encode(pair.encode()).decode()
    parts = urlsplit(url)
    env = {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"http.{parts.scheme}://{parts.netloc}/.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
    }
    return _Auth(env, (credential.secret, basic, pair), credential.kind)


@contextlib.contextmanager
def _key_auth(credential: GitCredential, tmp_dir: Path) -> Iterator[_Auth]:
    """The key in a 0600 file for as long as git runs; hosts are learnt on
    first use into the job's own known_hosts (there is no user to ask)."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    key = tmp_dir / "git-ssh-key"
    key.unlink(missing_ok=True)
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(credential.secret if credential.secret.endswith("\n") else credential.secret + "\n")
    command = [
        "ssh", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=accept-new",
        "-o", f"UserKnownHostsFile={tmp_dir / 'known_hosts'}", "-o", "BatchMode=yes",
    ]  # fmt: skip
    lines = tuple(line for line in credential.secret.splitlines() if len(line) >= 8)
    try:
        yield _Auth({"GIT_SSH_COMMAND": shlex.join(command)}, lines, credential.kind)
    finally:
        key.unlink(missing_ok=True)


def _refused(url: str, auth: _Auth, err: str) -> str:
    last = next((line.strip() for line in reversed(err.strip().splitlines()) if line.strip()), "")
    said = f" (git: {last[:300]})" if last else ""
    if not auth.kind:
        how = "--ssh-key-file <private key>" if not url.startswith(("http://", "https://")) else "--https-token <token>"
        return (
            f"the repository {url} needs a credential and none is set for it{said}. Set one with"
            f" `trainyard repo credential set --url {url} {how}`, or ship the code with `trainyard run --upload`"
        )
    return (
        f"the repository {url} refused the {auth.kind} credential set for it{said}: check that it is valid and"
        f" may read the repository, then set it again with `trainyard repo credential set --url {url} …`"
    )


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
    """GET the code; a network error or a 5xx is retried with backoff for
    retry.RETRY_SECONDS, a 403 (an expired link) gets a fresh link."""
    asked, backoff = 0, Backoff()
    while True:
        try:
            await asyncio.to_thread(download, url, dest)
            return
        except HttpError as e:
            pause = backoff.pause() if e.recoverable else None
            if pause is not None:
                log.warning("download of the %s: %s (retrying in %.1fs)", what, e, pause)
                await asyncio.sleep(pause)
                continue
            if e.status != 403 or fresh_url is None or asked == MAX_FRESH_URLS:
                raise CodeError(f"download of the {what} failed: {e}") from e
        except OSError as e:
            raise CodeError(f"download of the {what} failed: {e}") from e
        asked += 1
        try:
            url = await asyncio.to_thread(fresh_url, what)
        except (HttpError, OSError) as e:
            raise CodeError(f"download of the {what} failed: the link expired and no fresh one came: {e}") from e


async def _rmtree(path: Path) -> None:
    if path.exists():
        await asyncio.to_thread(shutil.rmtree, path, True)

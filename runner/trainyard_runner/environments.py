"""Job environments, built once per key and reused (docs/ENVIRONMENTS.md).

A job's ``environment:`` names a Python version, a requirements file of its
checkout, requirement lines and setup commands. Its **key** is a digest of
that spec (normalised), the contents of the files it names (the requirements
file and the files it includes with ``-r``/``-c``), and the platform: OS,
machine, the interpreter's version and ABI, the NVIDIA driver where there is
one. Two jobs with the same key get the same environment.

``prepare`` returns the environment of a key, building it the first time:

1. ``<root>/<key>/`` holds ``trainyard-env.json`` (written last): ready,
   reused as it is.
2. Otherwise the job takes ``<root>/<key>.build`` (``flock``, so jobs of any
   runner process of this machine build a key once: the others wait, then
   find it ready), and builds in ``<root>/<key>.building/``:
   ``uv venv --relocatable``; ``uv pip compile --generate-hashes`` of the
   requirements (the **lock**: exact versions and hashes); ``uv pip sync``
   of that lock; the setup commands with the environment activated; then
   ``uv pip freeze`` (what is installed, setup's packages included).
3. The folder is renamed to ``<root>/<key>/``: a build that died halfway
   leaves only a ``.building`` folder, removed by the next build.

A job holds ``<root>/<key>.use`` shared from before it looks until it ends
(``Environment.release``). After a build, ``evict`` removes environments
unused for 30 days, then the least recently used while the folder holds more
than 20 GiB; one whose ``.use`` or ``.build`` is held stays.

The build's output goes to the job's log; so does one line saying what
happened (built in N s / reused). uv's wheel cache is shared by the
runner's jobs (``UV_CACHE_DIR``, unless the job sets it); uv never downloads
an interpreter (``UV_PYTHON_DOWNLOADS=never``): a version the machine does
not have fails the job, saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import sys
import tarfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from . import http, jobuser
from .jobuser import JobUser
from .protocol import EnvironmentReport, EnvironmentSpec

READY_FILE = "trainyard-env.json"
USE_LOCK, BUILD_LOCK = ".use", ".build"  # ``<key>.use``, ``<key>.build``: flock files beside ``<key>/``
CACHE_DIR = ".uv-cache"  # uv's wheel cache, beside the environments it built
KEY_LENGTH = 24  # hex digits of the sha256
# ``-r other.txt`` / ``--constraint c.txt`` inside a requirements file.
_INCLUDE = re.compile(r"^\s*(?:-r|-c|--requirement|--constraint)(?:\s+|=)(\S+)")

Say = Callable[[str, list[str]], Awaitable[None]]  # (stream "o"|"e", lines) into the job's log


class EnvironmentBuildError(Exception):
    """The environment could not be built; the message says why (the job fails with it)."""


@dataclass
class Environment:
    key: str
    path: Path
    built: bool  # this job built it (False: reused)
    build_seconds: float  # how long its build took (this job's or the one before)
    lock: str  # the resolved requirements, with versions and hashes
    packages: str  # ``uv pip freeze`` after the setup commands
    size_bytes: int = 0
    platform: Mapping[str, str] = field(default_factory=dict)
    recipe: str = ""  # the key without the platform (``recipe_of``)
    # The key's lock, held shared while a job runs in it (``release``).
    lock_fd: int | None = field(default=None, compare=False)

    @classmethod
    def recorded(cls, path: Path, record: Mapping[str, object], facts: Mapping[str, str]) -> Environment:
        """The environment at ``path`` as its ``trainyard-env.json`` describes it (not built by this job)."""
        seconds, size = record.get("build_seconds", 0.0), record.get("size_bytes", 0)
        return cls(
            key=path.name,
            path=path,
            built=False,
            build_seconds=float(seconds) if isinstance(seconds, (int, float)) else 0.0,
            lock=str(record.get("lock", "")),
            packages=str(record.get("packages", "")),
            size_bytes=size if isinstance(size, int) else 0,
            platform=facts,
        )

    def release(self) -> None:
        """The job is done with it: it may be evicted from now on."""
        fd, self.lock_fd = self.lock_fd, None
        if fd is not None:
            os.close(fd)

    def report(self) -> EnvironmentReport:
        return EnvironmentReport(
            key=self.key,
            built=self.built,
            build_seconds=self.build_seconds,
            size_bytes=self.size_bytes,
            lock=self.lock,
            packages=self.packages,
            platform=dict(self.platform),
            recipe=self.recipe,
        )

    def activate(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with this environment first on PATH, as ``activate`` would."""
        out = dict(env)
        out["VIRTUAL_ENV"] = str(self.path)
        out["PATH"] = f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
        out.pop("PYTHONHOME", None)
        return out


def uv_binary() -> str:
    """The uv the runner was installed with (its own dependency), else one on PATH."""
    with contextlib.suppress(ImportError, FileNotFoundError):
        from uv import find_uv_bin

        return str(find_uv_bin())
    found = shutil.which("uv")
    if found is None:
        raise EnvironmentBuildError(
            "uv is not installed beside the runner (trainyard-runner depends on it: reinstall the runner)"
        )
    return found


def interpreter(spec: EnvironmentSpec, env: Mapping[str, str]) -> str:
    """The Python the environment is made from: ``python3.11`` for ``python:
    "3.11"``, else ``python3``, looked up on the job's PATH."""
    name = "python" + ".".join(spec.python.split(".")[:2]) if spec.python else "python3"
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found is None:
        want = f"python {spec.python}" if spec.python else "python3"
        raise EnvironmentBuildError(
            f"environment: {want} is not installed on this runner's machine ({name} is not on PATH);"
            " install it there or pick a version the machine has"
        )
    return found


async def platform_of(python: str) -> tuple[dict[str, str], str]:
    """What an environment built here depends on besides its spec and files,
    and the interpreter's own executable (``python`` may be a shim)."""
    probe = (
        "import sys, sysconfig; print(sys.version.split()[0], sys.implementation.cache_tag, sysconfig.get_platform());"
        " print(sys.executable)"
    )
    proc = await asyncio.create_subprocess_exec(
        python, "-c", probe, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise EnvironmentBuildError(f"environment: {python} does not run: {err.decode(errors='replace').strip()[:300]}")
    first, executable = out.decode().splitlines()[:2]
    version, tag, plat = first.split()
    facts = {"os": sys.platform, "machine": platform.machine(), "python": version, "abi": tag, "platform": plat}
    driver = Path("/proc/driver/nvidia/version")
    if driver.exists():
        with contextlib.suppress(OSError):
            facts["nvidia"] = driver.read_text(errors="replace").splitlines()[0].strip()
    return facts, executable


def files_of(spec: EnvironmentSpec, checkout: Path) -> dict[str, str]:
    """sha256 of each file the spec names (relative to the checkout), the
    files a requirements file includes with ``-r``/``-c`` too."""
    digests: dict[str, str] = {}
    pending = [spec.requirements] if spec.requirements else []
    root = checkout.resolve()
    while pending:
        name = pending.pop()
        path = (checkout / name).resolve()
        rel = os.path.relpath(path, root)
        if rel in digests:
            continue
        if rel.startswith(".." + os.sep) or rel == "..":
            raise EnvironmentBuildError(f"environment: requirements: {name} is outside the repository")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise EnvironmentBuildError(
                f"environment: requirements: {name} is not in the repository at this commit"
            ) from None
        except OSError as e:
            raise EnvironmentBuildError(f"environment: requirements: cannot read {name}: {e.strerror}") from None
        digests[rel] = hashlib.sha256(data).hexdigest()
        for line in data.decode(errors="replace").splitlines():
            match = _INCLUDE.match(line)
            if match:
                pending.append(os.path.relpath(path.parent / match.group(1), root))
    return digests


def recipe_of(spec: EnvironmentSpec, files: Mapping[str, str]) -> str:
    """The platform-free part of the key: the spec (without a re-run's lock)
    and its files' digests. The server computes the same from what the CLI
    sends (``trainyard_spec.environments.recipe_of``, kept apart because the
    runner does not depend on the spec package) to look environments up
    before a job runs."""
    material = {
        "python": spec.python,
        "requirements": spec.requirements,
        "pip": list(spec.pip),
        "setup": list(spec.setup),
        "files": dict(sorted(files.items())),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def key_of(spec: EnvironmentSpec, files: Mapping[str, str], facts: Mapping[str, str]) -> str:
    material = {"spec": spec.model_dump(mode="json"), "files": dict(files), "platform": dict(facts)}
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:KEY_LENGTH]


async def prepare_environment(
    spec: EnvironmentSpec,
    *,
    root: Path,
    checkout: Path,
    env: Mapping[str, str],
    say: Say,
    store: Store | None = None,
    user: JobUser | None = None,
) -> Environment:
    """The environment of ``spec`` for a job whose code is in ``checkout``,
    restored from ``store`` or built under ``root`` if it is not there yet
    (module docstring). ``user``: the job's own user, who runs the build
    (the requirements' build scripts and the setup commands are the job's
    code); the environment is then made root's, read-only for every job."""
    python = interpreter(spec, env)
    facts, executable = await platform_of(python)
    files = files_of(spec, checkout)
    key, recipe = key_of(spec, files, facts), recipe_of(spec, files)
    root.mkdir(parents=True, exist_ok=True)
    # ``<key>.use``: held shared while a job runs in it (``Environment.release``),
    # so eviction passes it by; taken before building, so a fresh build is not
    # evicted before its job starts.
    use_fd = _lock_file(root, key, USE_LOCK)
    try:
        await asyncio.to_thread(fcntl.flock, use_fd, fcntl.LOCK_SH)
        ready = _ready(root / key)
        if ready is None:
            built = await _build_once(
                spec,
                key=key,
                python=python,
                facts=facts,
                root=root,
                checkout=checkout,
                env=env,
                say=say,
                restore=None if store is None else functools.partial(_restore, store, executable=executable),
                user=user,
            )
            if built is not None:
                built.lock_fd, built.recipe = use_fd, recipe
                removed = evict(root, keep=key)
                if removed:
                    await say("o", [f"[trainyard] environments evicted to make room: {', '.join(removed)}"])
                return built
            ready = _ready(root / key) or {}
    except BaseException:
        os.close(use_fd)
        raise
    _touch(root / key)
    found = Environment.recorded(root / key, ready, facts)
    found.lock_fd, found.recipe = use_fd, recipe
    await say("o", [f"[trainyard] environment {key}: reused (built in {found.build_seconds:.1f} s)"])
    return found


async def _build_once(
    spec: EnvironmentSpec,
    *,
    key: str,
    python: str,
    facts: Mapping[str, str],
    root: Path,
    checkout: Path,
    env: Mapping[str, str],
    say: Say,
    restore: Callable[..., Awaitable[Environment | None]] | None,
    user: JobUser | None = None,
) -> Environment | None:
    """Build ``key`` holding ``<key>.build`` (restored from storage when
    ``restore`` finds it packed); None when another job made it meanwhile."""
    build_fd = _lock_file(root, key, BUILD_LOCK)
    try:
        if not _try_lock(build_fd, fcntl.LOCK_EX):
            await say("o", [f"[trainyard] environment {key}: another job is building it; waiting"])
            await asyncio.to_thread(fcntl.flock, build_fd, fcntl.LOCK_EX)
        if _ready(root / key) is not None:
            return None
        if restore is not None:
            restored = await restore(key=key, facts=facts, root=root, say=say)
            if restored is not None:
                return restored
        return await _build(
            spec, key=key, python=python, facts=facts, root=root, checkout=checkout, env=env, say=say, user=user
        )
    finally:
        os.close(build_fd)


class Store(Protocol):
    """The workspace's storage of packed environments, through the server
    (``Job`` implements it with the runner endpoints)."""

    async def find(self, key: str) -> tuple[str, int, str] | None:
        """(signed GET URL, size, sha256) of the packed ``key``, if there is one."""

    async def begin(self, key: str, size: int, sha256: str) -> tuple[str, dict[str, str]] | None:
        """Where to PUT ``key`` packed (URL, headers); None: stored already, or another runner uploads it."""

    async def done(self, key: str) -> None:
        """The upload finished (the server checks it)."""


async def _restore(
    store: Store, *, executable: str, key: str, facts: Mapping[str, str], root: Path, say: Say
) -> Environment | None:
    """``key`` unpacked from the workspace's storage into ``<root>/<key>/``,
    its interpreter links pointed at this machine's ``executable``; None
    (and a line saying why) when it is not there or cannot be used: the
    caller builds it."""
    started = time.monotonic()
    try:
        found = await store.find(key)
    except Exception as e:  # the server or storage unreachable: building still works
        await say("o", [f"[trainyard] environment {key}: could not look in storage ({e}); building it"])
        return None
    if found is None:
        return None
    url, size, sha256 = found
    download = root / f"{key}.download"
    building = root / f"{key}.building"
    shutil.rmtree(building, ignore_errors=True)
    try:
        await asyncio.to_thread(http.download, url, download, timeout=600)
        if download.stat().st_size != size or _sha256_file(download) != sha256:
            raise EnvironmentBuildError("the packed environment does not match its recorded size and sha256")
        await asyncio.to_thread(_unpack, download, building, executable)
        record = _ready(building)
        if record is None:
            raise EnvironmentBuildError("the packed environment has no record")
        seconds = round(time.monotonic() - started, 3)
        record.update(restored=True, restore_seconds=seconds, restored_at=time.time())
        (building / READY_FILE).write_text(json.dumps(record, indent=1), encoding="utf-8")
        shutil.rmtree(root / key, ignore_errors=True)
        os.rename(building, root / key)
    except Exception as e:
        shutil.rmtree(building, ignore_errors=True)
        await say("o", [f"[trainyard] environment {key}: could not restore it from storage ({e}); building it"])
        return None
    finally:
        download.unlink(missing_ok=True)
    _touch(root / key)
    restored = Environment.recorded(root / key, record, facts)
    await say(
        "o",
        [
            f"[trainyard] environment {key}: restored from storage in {seconds:.1f} s"
            f" (built in {restored.build_seconds:.1f} s)"
        ],
    )
    return restored


async def share(env: Environment, store: Store, *, say: Say) -> bool:
    """Pack ``env`` (which this job built) into the workspace's storage for
    runners on other machines; True when it was stored by this call. Never
    raises: a failed upload costs other machines a build, nothing more."""
    packed = env.path.parent / f"{env.key}.pack.tar"
    try:
        if await store.find(env.key) is not None:
            return False
        started = time.monotonic()
        size, sha256 = await asyncio.to_thread(_pack, env.path, packed)
        target = await store.begin(env.key, size, sha256)
        if target is None:
            return False
        url, headers = target
        await asyncio.to_thread(http.put_file, url, packed, headers=headers, timeout=600)
        await store.done(env.key)
        seconds = time.monotonic() - started
        await say(
            "o", [f"[trainyard] environment {env.key}: stored for other machines ({size >> 20} MiB, {seconds:.1f} s)"]
        )
        return True
    except Exception as e:
        await say("o", [f"[trainyard] environment {env.key}: could not store it for other machines: {e}"])
        return False
    finally:
        packed.unlink(missing_ok=True)


def _pack(path: Path, dest: Path) -> tuple[int, str]:
    """``path`` as a plain tar, without links to absolute paths (the
    interpreter: ``_unpack`` makes them again on the machine that restores
    it); (size, sha256) of the file. Not compressed: for scikit-learn's
    196 MiB, gzip -1 took 4.3 s to pack and 3.7 s to unpack against 0.8 s
    and 1.1 s, to save 136 MiB of a download (decision 0055)."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if info.issym() and os.path.isabs(info.linkname) else info

    with tarfile.open(dest, "w") as tar:
        tar.add(path, arcname=".", filter=keep)
    return dest.stat().st_size, _sha256_file(dest)


def _unpack(archive: Path, dest: Path, executable: str) -> None:
    """Extract with the parser that checked it: Python's ``tarfile`` under
    its ``data`` filter (no absolute path, nothing outside ``dest``, no
    link out of it, no device, no set-id bits), member by member as it
    writes them. A second parser for the writing (GNU tar) could read the
    same bytes as other members than the ones checked
    (docs/decisions/0093-one-tar-parser.md). A refused member raises
    ``tarfile.FilterError``; the caller removes ``dest``."""
    dest.mkdir(parents=True)
    with tarfile.open(archive, "r:") as tar:
        tar.extractall(dest, filter="data")
    link = dest / "bin" / "python"
    link.unlink(missing_ok=True)
    link.symlink_to(executable)
    config = dest / "pyvenv.cfg"
    if config.exists():
        lines = config.read_text(encoding="utf-8").splitlines()
        home = f"home = {os.path.dirname(executable)}"
        config.write_text("\n".join(home if s.startswith("home =") else s for s in lines) + "\n", encoding="utf-8")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _lock_file(root: Path, key: str, suffix: str) -> int:
    return os.open(root / f"{key}{suffix}", os.O_RDWR | os.O_CREAT, 0o644)


def evict(root: Path, *, keep: str, max_bytes: int | None = None, max_age_seconds: float | None = None) -> list[str]:
    """Remove environments of ``root`` unused for ``max_age_seconds``, then
    the least recently used while they hold more than ``max_bytes``
    (``TRAINYARD_ENVIRONMENTS_MAX_BYTES``, default 20 GiB;
    ``TRAINYARD_ENVIRONMENTS_MAX_AGE_DAYS``, default 30). ``keep`` and any
    environment a job runs in or builds (its lock is held) stay. Returns
    the keys removed."""
    max_bytes = _env_number("TRAINYARD_ENVIRONMENTS_MAX_BYTES", 20 << 30) if max_bytes is None else max_bytes
    if max_age_seconds is None:
        max_age_seconds = _env_number("TRAINYARD_ENVIRONMENTS_MAX_AGE_DAYS", 30) * 86400
    found: list[tuple[float, str, int]] = []  # (last used, key, bytes)
    for ready in root.glob(f"*/{READY_FILE}"):
        record = _ready(ready.parent) or {}
        size = record.get("size_bytes", 0)
        with contextlib.suppress(OSError):
            found.append((ready.stat().st_mtime, ready.parent.name, size if isinstance(size, int) else 0))
    found.sort()
    total = sum(size for _, _, size in found)
    now = time.time()
    removed: list[str] = []
    for used, key, size in found:
        if key == keep or (total <= max_bytes and now - used <= max_age_seconds):
            continue
        use_fd, build_fd = _lock_file(root, key, USE_LOCK), _lock_file(root, key, BUILD_LOCK)
        try:
            if not (_try_lock(use_fd, fcntl.LOCK_EX) and _try_lock(build_fd, fcntl.LOCK_EX)):
                continue  # a job runs in it or builds it
            shutil.rmtree(root / key, ignore_errors=True)
            removed.append(key)
            total -= size
        finally:
            os.close(use_fd)
            os.close(build_fd)
    return removed


def _env_number(name: str, default: float) -> int:
    try:
        return int(float(os.environ.get(name) or default))
    except ValueError:
        return int(default)


async def _build(
    spec: EnvironmentSpec,
    *,
    key: str,
    python: str,
    facts: Mapping[str, str],
    root: Path,
    checkout: Path,
    env: Mapping[str, str],
    say: Say,
    user: JobUser | None = None,
) -> Environment:
    started = time.monotonic()
    building = root / f"{key}.building"
    shutil.rmtree(building, ignore_errors=True)  # a build that died halfway
    uv = uv_binary()
    base = dict(env)
    if user is None:
        base.setdefault("UV_CACHE_DIR", str(root / CACHE_DIR))  # per folder: a workspace's setup cannot touch another's
    else:
        # The job's own (in its home, unless it sets one): a cache shared by
        # every job's user would let one job plant wheels for the next.
        building.mkdir()
        jobuser.give(building, user.uid, user.gid)
    base["UV_PYTHON_DOWNLOADS"] = "never"
    base["UV_NO_PROGRESS"] = "1"
    base.pop("VIRTUAL_ENV", None)
    await say("o", [f"[trainyard] environment {key}: building (python {spec.python or 'python3'})"])
    step = functools.partial(_step, say, base, checkout, user=user)
    try:
        await step(
            "creating the virtual environment",
            [uv, "venv", "--relocatable", "--python", python, str(building)],
        )
        venv_python = str(building / "bin" / "python")
        lock = spec.lock
        inputs = "" if lock else _requirements_in(spec, checkout)
        if lock:
            lock_path = building / "trainyard-lock.txt"
            lock_path.write_text(lock, encoding="utf-8")
            await say("o", ["[trainyard] installing the recorded lock (a re-run): nothing is resolved again"])
            await step(
                "installing the recorded lock",
                [uv, "pip", "sync", "--python", venv_python, str(lock_path)],
            )
        elif inputs:
            tmp = root / f"{key}.building.in"
            tmp.write_text(inputs, encoding="utf-8")
            tmp.chmod(0o644)  # read by the job's user
            try:
                lock_path = building / "trainyard-lock.txt"
                await step(
                    "resolving the requirements",
                    [
                        uv,
                        "pip",
                        "compile",
                        "--quiet",
                        "--generate-hashes",
                        "--no-header",
                        "--python",
                        venv_python,
                        "-o",
                        str(lock_path),
                        str(tmp),
                    ],
                )
            finally:
                tmp.unlink(missing_ok=True)
            lock = lock_path.read_text(encoding="utf-8")
            await step(
                "installing the locked requirements",
                [uv, "pip", "sync", "--python", venv_python, str(lock_path)],
            )
        activated = Environment(key, building, True, 0.0, lock, "").activate(base)
        activated["UV"] = uv
        activated["PATH"] = f"{activated['PATH']}{os.pathsep}{Path(uv).parent}"
        if spec.setup:
            await _step(
                say,
                activated,
                checkout,
                "running the setup commands",
                ["bash", "-c", "set -e\n" + "\n".join(spec.setup) + "\n"],
                user=user,
            )
        packages = await _output(base, checkout, [uv, "pip", "freeze", "--python", venv_python], user=user)
        if user is not None:  # shared from now on: no later job's user may change it
            await asyncio.to_thread(jobuser.take_back, building)
        seconds = round(time.monotonic() - started, 3)
        size = _size_of(building)
        record = {
            "key": key,
            "spec": spec.model_dump(mode="json"),
            "lock": lock,
            "packages": packages,
            "build_seconds": seconds,
            "size_bytes": size,
            "platform": dict(facts),
            "built_at": time.time(),
        }
        (building / READY_FILE).write_text(json.dumps(record, indent=1), encoding="utf-8")
        shutil.rmtree(root / key, ignore_errors=True)  # an unreadable record: built again
        os.rename(building, root / key)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    _touch(root / key)
    count = sum(1 for line in packages.splitlines() if line.strip() and not line.startswith("#"))
    await say("o", [f"[trainyard] environment {key}: built in {seconds:.1f} s ({count} packages)"])
    return Environment(
        key=key,
        path=root / key,
        built=True,
        build_seconds=seconds,
        lock=lock,
        packages=packages,
        size_bytes=size,
        platform=facts,
    )


def _requirements_in(spec: EnvironmentSpec, checkout: Path) -> str:
    lines = [f"-r {shlex.quote(str((checkout / spec.requirements).resolve()))}"] if spec.requirements else []
    lines += list(spec.pip)
    return "".join(line + "\n" for line in lines)


async def _step(
    say: Say, env: Mapping[str, str], cwd: Path, what: str, argv: list[str], *, user: JobUser | None = None
) -> None:
    """Run one build step (as ``user`` if given), its output (both streams) into the job's log."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        user=_uid(user),
        group=_uid(user),
        extra_groups=None if user is None else [],
    )
    assert proc.stdout is not None
    tail: list[str] = []
    while line := await proc.stdout.readline():
        text = line.decode(errors="replace").rstrip("\n")
        if text.startswith("Activate with:"):
            continue  # names the temporary folder; the job runs with it activated anyway
        tail = [*tail[-19:], text]
        await say("o", [text])
    code = await proc.wait()
    if code != 0:
        last = next((t.strip() for t in reversed(tail) if t.strip()), "")
        raise EnvironmentBuildError(
            f"environment: {what} failed (exit code {code})" + (f": {last[:300]}" if last else "")
        )


async def _output(env: Mapping[str, str], cwd: Path, argv: list[str], *, user: JobUser | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        user=_uid(user),
        group=_uid(user),
        extra_groups=None if user is None else [],
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise EnvironmentBuildError(
            f"environment: listing the installed packages failed: {err.decode(errors='replace')[:300]}"
        )
    return out.decode(errors="replace")


def _ready(path: Path) -> dict[str, object] | None:
    try:
        record = json.loads((path / READY_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):
        return None  # unreadable: built again (the build replaces it)
    return record if isinstance(record, dict) else None


def _size_of(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _touch(path: Path) -> None:
    """Mark the environment used now (eviction goes by last use)."""
    with contextlib.suppress(OSError):
        os.utime(path / READY_FILE)


def _uid(user: JobUser | None) -> int | None:
    """The uid (and gid) a build step runs as; None: the runner's."""
    return None if user is None else user.uid

"""The runner as this server serves it to the machines it boots: a wheel of
the server's own ``trainyard_runner`` (so a machine runs exactly the
server's version), the binary wheels of its dependencies for the Pythons and
CPUs cloud images have, and a pip wheel (for a Python without ensurepip).

Made once into ``TRAINYARD_RUNNER_WHEELHOUSE`` (default
``<DATA_DIR>/runner-wheels``), in a folder named after what it holds, by
whichever process asks first (a file lock keeps the others waiting), or
ahead of time with ``manage.py runner_wheels``. The dependencies are pinned to
the versions installed beside this server and downloaded with this Python's
pip, from the package index its configuration names
(docs/decisions/0023-runner-wheels-served.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.resources
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from backend.clouds.services.wheels import WHEEL_NAME, Package, canonical, digest, find_links_page, project_page, wheel

logger = logging.getLogger(__name__)

RUNNER_DIST = "trainyard-runner"
# CPython versions and CPUs of the stock images: Ubuntu 24.04 has 3.12, Debian 12
# 3.11, Amazon Linux 2023 offers python3.11 beside its 3.9 (the runner needs 3.11).
PYTHONS = ("3.11", "3.12", "3.13")
ARCHES = ("x86_64", "aarch64")
# glibc 2.28 or newer: Ubuntu 20.04+, Debian 10+, Amazon Linux 2023, RHEL 8+.
MANYLINUX = ("manylinux_2_28", "manylinux2014", "manylinux_2_17", "manylinux_2_5", "manylinux1")
PIP_TIMEOUT = 300.0
COMPLETE = "COMPLETE"
INDEX = "index.html"
_LINK = re.compile(r'href="([^"#]+)#sha256=([0-9a-f]{64})"')


class WheelhouseError(Exception):
    """The wheels could not be made; the message says why and what to do."""


def wheelhouse() -> Path:
    """The folder of wheels (with ``index.html``), made on the first call."""
    root = Path(settings.TRAINYARD["RUNNER_WHEELHOUSE"])
    runner = _runner_files()
    pins = dependency_pins()
    dest = root / _key(runner, pins)
    if (dest / COMPLETE).exists():
        return dest
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WheelhouseError(f"cannot create the runner wheelhouse {root}: {e}") from None
    with _locked(root / ".lock"):
        if (dest / COMPLETE).exists():  # another process made it meanwhile
            return dest
        started = time.monotonic()
        partial = Path(tempfile.mkdtemp(prefix=f"{dest.name}.partial-", dir=root))
        try:
            _build(partial, runner, pins)
            (partial / COMPLETE).write_text("")
            if dest.exists():
                shutil.rmtree(dest)
            partial.rename(dest)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        logger.info("made the runner wheelhouse %s in %.1fs", dest, time.monotonic() - started)
    return dest


def wheel_path(name: str) -> Path | None:
    """The file of wheel ``name`` in the wheelhouse, or None if there is none."""
    if not WHEEL_NAME.match(name):
        return None
    path = wheelhouse() / name
    return path if path.is_file() else None


def index_html() -> bytes:
    """Every wheel: ``pip install --find-links <this page> trainyard-runner``."""
    return (wheelhouse() / INDEX).read_bytes()


def project_html(project: str) -> bytes | None:
    """The PEP 503 page of one project here (``--extra-index-url``), or None."""
    listed = _LINK.findall((wheelhouse() / INDEX).read_text())
    page = project_page(project, listed)
    return page.encode() if page is not None else None


def dependency_pins() -> dict[str, str]:
    """The runner's dependencies, transitively, pinned to the versions installed here."""
    pins: dict[str, str] = {}
    todo = _requirements(RUNNER_DIST)
    while todo:
        name = todo.pop()
        if name in pins:
            continue
        try:
            pins[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # needed only under a marker this Python does not meet (pip resolves it per target)
        todo.extend(_requirements(name))
    return dict(sorted(pins.items()))


# ------------------------------------------------------------------ building


def _build(dest: Path, runner: dict[str, bytes], pins: dict[str, str]) -> None:
    _runner_wheel(dest, runner)
    constraints = dest / "constraints.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))
    direct = [f"{n}=={pins[canonical(n)]}" for n in _requirements(RUNNER_DIST) if canonical(n) in pins]
    jobs = [(py, arch) for py in PYTHONS for arch in ARCHES]
    with ThreadPoolExecutor(max_workers=3) as pool:
        pip_job = pool.submit(_pip_download, dest, ["--no-deps", f"pip=={importlib.metadata.version('pip')}"], [])
        for done in [pool.submit(_download_for, dest, constraints, direct, *job) for job in jobs]:
            done.result()
        pip_job.result()
    constraints.unlink()
    _write_index(dest)


def _download_for(dest: Path, constraints: Path, direct: list[str], python: str, arch: str) -> None:
    flags = ["--implementation", "cp", "--python-version", python, "--abi", f"cp{python.replace('.', '')}"]
    for tag in MANYLINUX:
        flags += ["--platform", f"{tag}_{arch}"]
    _pip_download(dest, ["-c", str(constraints), *direct], flags, what=f"Python {python} on {arch}")


def _pip_download(dest: Path, reqs: list[str], flags: list[str], *, what: str = "pip") -> None:
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
            "--only-binary=:all:", "--dest", tmp, *flags, *reqs,
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise WheelhouseError(
                f"downloading the runner's wheels for {what} took more than {PIP_TIMEOUT:.0f}s; {_ADVICE}"
            ) from None
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
            raise WheelhouseError(
                f"could not download the runner's wheels for {what}: {' '.join(errors[-2:])[:500]}; {_ADVICE}"
            )
        for wheel in Path(tmp).glob("*.whl"):
            target = dest / wheel.name
            if not target.exists():
                wheel.rename(target)


_ADVICE = (
    "the server downloads them once with its own pip (its package index must be reachable), "
    "or run `manage.py runner_wheels` where it is and copy TRAINYARD_RUNNER_WHEELHOUSE"
)


def _runner_wheel(dest: Path, files: dict[str, bytes]) -> Path:
    """A wheel of the runner package as installed beside this server: its own
    files, its metadata, and a version that names their content."""
    meta = importlib.metadata.metadata(RUNNER_DIST)
    package = Package(
        dist=RUNNER_DIST,
        version=f"{meta['Version']}+g{digest(files)[:10]}",
        summary=meta["Summary"] or "",
        requires_python=meta["Requires-Python"] or "",
        requires=importlib.metadata.requires(RUNNER_DIST) or [],
        scripts={"trainyard-runner": "trainyard_runner.__main__:main"},
    )
    name, data = wheel(package, {f"trainyard_runner/{n}": d for n, d in files.items()})
    path = dest / name
    path.write_bytes(data)
    return path


def _write_index(dest: Path) -> None:
    listed = [(w.name, hashlib.sha256(w.read_bytes()).hexdigest()) for w in dest.glob("*.whl")]
    (dest / INDEX).write_text(find_links_page(RUNNER_DIST, listed))


# ------------------------------------------------------------------ helpers


def _runner_files() -> dict[str, bytes]:
    """The runner package's own files (sources and data, no bytecode)."""
    root = Path(str(importlib.resources.files("trainyard_runner")))
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")
    }


def _requirements(dist: str) -> list[str]:
    """Names of ``dist``'s requirements, without those of extras."""
    names = []
    for req in importlib.metadata.requires(dist) or []:
        if "extra ==" in req:
            continue
        names.append(canonical(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]))
    return names


def _key(runner: dict[str, bytes], pins: dict[str, str]) -> str:
    what = [digest(runner), *(f"{n}=={v}" for n, v in pins.items()), *PYTHONS, *ARCHES]
    return hashlib.sha256("\n".join(what).encode()).hexdigest()[:16]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


__all__ = ["WheelhouseError", "dependency_pins", "index_html", "project_html", "wheel_path", "wheelhouse"]

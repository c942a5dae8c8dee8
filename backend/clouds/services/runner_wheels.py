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

import base64
import fcntl
import hashlib
import html
import importlib.metadata
import importlib.resources
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

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
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+\.whl$")


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
    if not _NAME.match(name):
        return None
    path = wheelhouse() / name
    return path if path.is_file() else None


def index_html() -> bytes:
    """``pip install --no-index --find-links <this page> trainyard-runner``."""
    return (wheelhouse() / INDEX).read_bytes()


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
    direct = [f"{n}=={pins[_canonical(n)]}" for n in _requirements(RUNNER_DIST) if _canonical(n) in pins]
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
    version = f"{meta['Version']}+g{_digest(files)[:10]}"
    info = f"trainyard_runner-{version}.dist-info"
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {RUNNER_DIST}",
        f"Version: {version}",
        f"Summary: {meta['Summary'] or ''}",
    ]
    if meta["Requires-Python"]:
        metadata.append(f"Requires-Python: {meta['Requires-Python']}")
    metadata += [f"Requires-Dist: {r}" for r in importlib.metadata.requires(RUNNER_DIST) or []]
    entries = {
        **{f"trainyard_runner/{name}": data for name, data in files.items()},
        f"{info}/METADATA": ("\n".join(metadata) + "\n").encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: trainyard\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": b"[console_scripts]\ntrainyard-runner = trainyard_runner.__main__:main\n",
    }
    record = [f"{name},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}" for name, data in entries.items()]
    entries[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = dest / f"trainyard_runner-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in entries.items():
            info_ = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info_.external_attr = 0o644 << 16
            wheel.writestr(info_, data, zipfile.ZIP_DEFLATED)
    return path


def _write_index(dest: Path) -> None:
    links = []
    for wheel in sorted(dest.glob("*.whl")):
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        name = html.escape(wheel.name)
        links.append(f'<a href="{name}#sha256={digest}">{name}</a><br>')
    page = "<!DOCTYPE html>\n<html><head><title>trainyard-runner</title></head><body>\n"
    (dest / INDEX).write_text(page + "\n".join(links) + "\n</body></html>\n")


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
        names.append(_canonical(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]))
    return names


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _key(runner: dict[str, bytes], pins: dict[str, str]) -> str:
    what = [_digest(runner), *(f"{n}=={v}" for n, v in pins.items()), *PYTHONS, *ARCHES]
    return hashlib.sha256("\n".join(what).encode()).hexdigest()[:16]


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name, data in sorted(files.items()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


__all__ = ["WheelhouseError", "dependency_pins", "index_html", "wheel_path", "wheelhouse"]

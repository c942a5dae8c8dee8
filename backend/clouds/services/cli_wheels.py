"""The CLI as this server serves it (``/cli/wheels/``): wheels of
``trainyard-cli`` and of ``trainyard-spec``, its dependency, written from the
sources beside this server (``cli/`` and ``spec/`` of its checkout or image),
so a user installs the CLI that matches the server before the names are
published (docs/CLI.md, "Installing"). Their other dependencies come from the
user's package index.

The server does not import the CLI: it reads its files and ``pyproject.toml``.
The wheels are made in memory and kept while the sources are unchanged; the
version carries a digest of the files (``0.1.0+g<digest>``), which the CLI's
``trainyard-spec==0.1.0`` pin still matches (PEP 440 ignores the local label).
"""

from __future__ import annotations

import hashlib
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from backend.clouds.services.wheels import (
    WHEEL_NAME,
    Package,
    digest,
    find_links_page,
    package_files,
    project_page,
    wheel,
)

CLI_DIST = "trainyard-cli"
# The distributions served here, by their source folder in the checkout.
SOURCES = {CLI_DIST: "cli", "trainyard-spec": "spec"}


class CliWheelsError(Exception):
    """The wheels cannot be made; the message says why."""


@dataclass(frozen=True)
class Wheelhouse:
    key: str
    wheels: dict[str, bytes]  # file name -> content
    sha256: dict[str, str]  # file name -> hex digest

    def index_html(self) -> bytes:
        """Every wheel: ``pip install --find-links <this page> trainyard-cli``."""
        return find_links_page(CLI_DIST, self.sha256.items()).encode()

    def project_html(self, project: str) -> bytes | None:
        """The PEP 503 page of one project (``--extra-index-url``), or None."""
        page = project_page(project, self.sha256.items())
        return page.encode() if page is not None else None

    def wheel(self, name: str) -> bytes | None:
        return self.wheels.get(name) if WHEEL_NAME.match(name) else None


_lock = threading.Lock()
_made: Wheelhouse | None = None
_made_stamp: tuple[tuple[str, int, int], ...] = ()


def wheelhouse() -> Wheelhouse:
    """The served wheels, made again only when a source file changed (the
    files are read again only when one's size or modification time moved)."""
    global _made, _made_stamp
    stamp = _stamp()
    with _lock:
        if _made is not None and stamp == _made_stamp:
            return _made
    sources = [_read(dist, folder) for dist, folder in SOURCES.items()]
    key = digest({f"{p.dist}/{n}": d for p, files in sources for n, d in files.items()})
    with _lock:
        if _made is None or _made.key != key:
            wheels = dict(wheel(package, files) for package, files in sources)
            sha = {name: hashlib.sha256(data).hexdigest() for name, data in wheels.items()}
            _made = Wheelhouse(key, wheels, sha)
        _made_stamp = stamp
        return _made


def _stamp() -> tuple[tuple[str, int, int], ...]:
    """Path, size and modification time of every file the wheels are read from."""
    base = Path(settings.BASE_DIR)
    found = []
    for folder in SOURCES.values():
        for path in sorted((base / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                st = path.stat()
                found.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(found)


def _read(dist: str, folder: str) -> tuple[Package, dict[str, bytes]]:
    root = Path(settings.BASE_DIR) / folder
    try:
        pyproject = tomllib.loads((root / "pyproject.toml").read_text())
        project, packages = pyproject["project"], pyproject["tool"]["setuptools"]["packages"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        raise CliWheelsError(f"the sources of {dist} are not beside this server ({root}: {e})") from None
    files: dict[str, bytes] = {}
    for name in packages:
        if "." not in name:  # a subpackage's files come with its top package
            files.update(package_files(root, name))
    if project.get("name") != dist or not files:
        raise CliWheelsError(f"{root} holds no {dist} (its pyproject.toml names {project.get('name')!r})")
    version = f"{project['version']}+g{digest(files)[:10]}"
    package = Package(
        dist=dist,
        version=version,
        summary=project.get("description", ""),
        requires_python=project.get("requires-python", ""),
        requires=list(project.get("dependencies", [])),
        scripts=dict(project.get("scripts", {})),
    )
    return package, files


__all__ = ["CLI_DIST", "CliWheelsError", "Wheelhouse", "wheelhouse"]

"""Wheels as this server writes and lists them: a pure-Python wheel from a
package's files (a zip with METADATA, WHEEL, entry points and RECORD, as a
build backend writes it), and the two pages pip reads — a find-links page
(every wheel, ``--find-links``) and a PEP 503 project page
(``--extra-index-url``, which asks for ``<index>/<project>/``).
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

WHEEL_NAME = re.compile(r"^[A-Za-z0-9_.+-]+\.whl$")


@dataclass(frozen=True)
class Package:
    """What a wheel says about its distribution."""

    dist: str  # "trainyard-cli"
    version: str  # "0.1.0+g1234567890"
    summary: str = ""
    requires_python: str = ""
    requires: list[str] = field(default_factory=list)
    scripts: dict[str, str] = field(default_factory=dict)  # command -> "module:function"


def wheel(package: Package, files: dict[str, bytes]) -> tuple[str, bytes]:
    """The wheel (file name, bytes) of ``files`` (archive path -> content), reproducible."""
    stem = f"{_underscored(package.dist)}-{package.version}"
    info = f"{stem}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {package.dist}", f"Version: {package.version}"]
    metadata.append(f"Summary: {package.summary}")
    if package.requires_python:
        metadata.append(f"Requires-Python: {package.requires_python}")
    metadata += [f"Requires-Dist: {r}" for r in package.requires]
    entries = {
        **files,
        f"{info}/METADATA": ("\n".join(metadata) + "\n").encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: trainyard\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if package.scripts:
        lines = "".join(f"{name} = {target}\n" for name, target in package.scripts.items())
        entries[f"{info}/entry_points.txt"] = f"[console_scripts]\n{lines}".encode()
    record = [f"{name},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}" for name, data in entries.items()]
    entries[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    out = BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            entry = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, data, zipfile.ZIP_DEFLATED)
    return f"{stem}-py3-none-any.whl", out.getvalue()


def package_files(root: Path, package: str) -> dict[str, bytes]:
    """A package folder's sources and ``py.typed`` (no bytecode), keyed by archive path."""
    top = root / package
    return {
        f"{package}/{p.relative_to(top).as_posix()}": p.read_bytes()
        for p in sorted(top.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")
    }


def digest(files: dict[str, bytes]) -> str:
    """A hex digest naming the content of ``files``."""
    h = hashlib.sha256()
    for name, data in sorted(files.items()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def find_links_page(title: str, wheels: Iterable[tuple[str, str]]) -> str:
    """Every wheel ``(file name, sha256)``, linked by its name beside this page."""
    links = [f'<a href="{html.escape(n)}#sha256={d}">{html.escape(n)}</a><br>' for n, d in sorted(wheels)]
    return f"<!DOCTYPE html>\n<html><head><title>{html.escape(title)}</title></head><body>\n" + (
        "\n".join(links) + "\n</body></html>\n"
    )


def project_page(project: str, wheels: Iterable[tuple[str, str]]) -> str | None:
    """The PEP 503 page of ``project`` (its wheels, linked one folder up), or None if none is here."""
    wanted = canonical(project)
    mine = [(n, d) for n, d in sorted(wheels) if canonical(n.split("-", 1)[0]) == wanted]
    if not mine:
        return None
    links = [f'<a href="../{html.escape(n)}#sha256={d}">{html.escape(n)}</a><br>' for n, d in mine]
    return f"<!DOCTYPE html>\n<html><head><title>Links for {html.escape(wanted)}</title></head><body>\n" + (
        "\n".join(links) + "\n</body></html>\n"
    )


def canonical(name: str) -> str:
    """The PEP 503 normalized form of a project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _underscored(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


__all__ = ["WHEEL_NAME", "Package", "canonical", "digest", "find_links_page", "package_files", "project_page", "wheel"]

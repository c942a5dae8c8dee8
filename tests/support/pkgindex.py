"""A real package index on localhost for environment tests: pure-Python
wheels built here (a zip with METADATA, WHEEL and RECORD, as any build
backend writes them) served as a PEP 503 "simple" index over HTTP, so uv and
pip install from it exactly as from PyPI, with no network.

``PackageIndex.add("tinypkg", "1.1")`` publishes a newer version while the
index runs (a release that appeared after a run was locked).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class PackageIndex:
    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url  # …/simple, for --index-url / UV_INDEX_URL / PIP_INDEX_URL
        self.requests: list[str] = []  # paths GET asked for, in order (the server appends)

    def add(self, name: str, version: str, *, body: str = "") -> Path:
        """Build ``name==version`` (a module ``name`` with ``VERSION``) and list it."""
        files = self.root / "files"
        files.mkdir(parents=True, exist_ok=True)
        wheel = build_wheel(files, name, version, body or f'VERSION = "{version}"\n')
        self._write_listing(name)
        return wheel

    def downloads(self) -> list[str]:
        """The wheels fetched so far (file names)."""
        return [p.rsplit("/", 1)[-1] for p in self.requests if p.endswith(".whl")]

    def _write_listing(self, name: str) -> None:
        page = self.root / "simple" / name
        page.mkdir(parents=True, exist_ok=True)
        links = []
        for wheel in sorted((self.root / "files").glob(f"{name}-*.whl")):
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            href = html.escape(f"../../files/{wheel.name}#sha256={digest}")
            links.append(f'<a href="{href}">{html.escape(wheel.name)}</a><br/>')
        (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
        projects = sorted(p.name for p in (self.root / "simple").iterdir() if p.is_dir())
        listing = "".join(f'<a href="{p}/">{p}</a><br/>\n' for p in projects)
        (self.root / "simple" / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{listing}</body></html>\n")


@contextmanager
def package_index(root: Path) -> Iterator[PackageIndex]:
    root.mkdir(parents=True, exist_ok=True)
    index = PackageIndex(root, "")

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            index.requests.append(self.path)
            super().do_GET()

        def end_headers(self) -> None:
            # The listings change while the index runs: clients must ask again
            # (PyPI lets them keep a listing 10 minutes).
            if not self.path.endswith(".whl"):
                self.send_header("Cache-Control", "no-cache")
            super().end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    index.url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()


def build_wheel(folder: Path, name: str, version: str, body: str) -> Path:
    """A real wheel of a one-module package ``name`` whose ``__init__.py`` is
    ``body``, written by hand (a wheel is a zip with its metadata), so no
    build backend is needed; its path in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": body.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: trainyard-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{arc},sha256={_b64_digest(data)},{len(data)}" for arc, data in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files.items():
            z.writestr(zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return path


def _b64_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

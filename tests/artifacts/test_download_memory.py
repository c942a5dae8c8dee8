"""Issue 33, item 1: a download from the local storage, and a zip of an
artifact, stream through the web process with bounded memory. Under ASGI
Django collects a synchronous body (a ``FileResponse``, a generator) whole
before sending a byte, so one viewer downloading a 2 GiB model would add
2 GiB to the shared process.

The real web server (uvicorn) serves sparse files (no disk used) while the
test reads the response in blocks, discards them, and samples the server's
RSS from /proc/<pid>/status."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from backend.artifacts.archive import archive_url
from backend.artifacts.models import Artifact
from backend.artifacts.services import FileIn, artifact_begin, artifact_file_key
from backend.artifacts.storage import get_storage
from backend.runs.models import Run
from tests.support.web import WebServer, WebServers

pytestmark = pytest.mark.django_db(transaction=True)

MB = 1 << 20
GIB = 1 << 30
GROWTH_LIMIT = 100 * MB
KILL_AT = GIB  # a server that buffers the body is stopped here: it must not take the machine down with it
READ_BLOCK = MB


class RssWatch:
    """Samples a process's resident memory every 20 ms while the block runs."""

    def __init__(self, pid: int, kill: Any) -> None:
        self.pid = pid
        self.kill = kill
        self.base = _rss(pid)
        self.peak = self.base
        self.killed = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @property
    def growth(self) -> int:
        return self.peak - self.base

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            try:
                self.peak = max(self.peak, _rss(self.pid))
            except FileNotFoundError:
                return
            if self.growth > KILL_AT and not self.killed:
                self.killed = True
                self.kill()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _download(url: str) -> tuple[int, bytes]:
    """(bytes received, the last 64 KiB), read a block at a time and discarded."""
    received, tail = 0, b""
    try:
        with httpx.stream("GET", url, timeout=120) as response:
            assert response.status_code == 200, response.read()
            for block in response.iter_raw(READ_BLOCK):
                received += len(block)
                tail = (tail + block)[-65536:]
    except httpx.HTTPError:  # the watch stopped a server that buffered the body
        pass
    return received, tail


@pytest.fixture
def storage_dir(settings: Any, tmp_path: Path) -> Path:
    root = tmp_path / "storage"
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": root}
    return root


def _artifact(run: Run, sizes: dict[str, int]) -> Artifact:
    """An artifact whose files are sparse files of these sizes (no disk used)."""
    manifest = [FileIn(path, size, "0" * 64) for path, size in sizes.items()]
    artifact, _ = artifact_begin(job=run.jobs.get(), path="./out", files=manifest)
    storage = get_storage()
    for file in artifact.files.all():
        path = storage.root / artifact_file_key(artifact, file)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            handle.truncate(file.size)
    return artifact


def _server(web_server: WebServers, storage_dir: Path) -> tuple[WebServer, int]:
    server = web_server.start(TRAINYARD_STORAGE_DIR=str(storage_dir))
    process = server._process  # the uvicorn process itself (one worker)
    assert process is not None
    return server, process.pid


def _warm(server: WebServer, artifact: Artifact) -> None:
    """One small download first: what the first request imports is not the body's memory."""
    small = artifact.files.get(path="readme.txt")
    url = get_storage().signed_url(artifact_file_key(artifact, small), method="GET")
    assert httpx.get(server.url + urlsplit(url).path, timeout=30).status_code == 200


def test_a_2_gib_download_keeps_the_web_process_growth_under_100_mb(
    web_server: WebServers, storage_dir: Path, run: Run
) -> None:
    artifact = _artifact(run, {"model.bin": 2 * GIB, "readme.txt": 100})
    server, pid = _server(web_server, storage_dir)
    _warm(server, artifact)
    model = artifact.files.get(path="model.bin")
    url = get_storage().signed_url(artifact_file_key(artifact, model), method="GET")

    started = time.monotonic()
    with RssWatch(pid, server.kill) as watch:
        received, _ = _download(server.url + urlsplit(url).path)
    seconds = time.monotonic() - started

    print(f"2 GiB download: {seconds:.1f} s, server RSS {watch.base / MB:.0f} MB + {watch.growth / MB:.0f} MB")
    assert not watch.killed and watch.growth < GROWTH_LIMIT, f"the server grew by {watch.growth / MB:.0f} MB"
    assert received == 2 * GIB


def test_a_zip_of_large_files_keeps_the_web_process_growth_under_100_mb(
    web_server: WebServers, storage_dir: Path, run: Run
) -> None:
    sizes = {"ckpt/a.bin": GIB, "ckpt/b.bin": GIB + 12345, "readme.txt": 100}
    artifact = _artifact(run, sizes)
    server, pid = _server(web_server, storage_dir)
    _warm(server, artifact)
    url = archive_url(artifact=artifact, prefix="ckpt/")

    started = time.monotonic()
    with RssWatch(pid, server.kill) as watch:
        received, tail = _download(server.url + urlsplit(url).path)
    seconds = time.monotonic() - started

    print(f"2 GiB zip: {seconds:.1f} s, server RSS {watch.base / MB:.0f} MB + {watch.growth / MB:.0f} MB")
    assert not watch.killed and watch.growth < GROWTH_LIMIT, f"the server grew by {watch.growth / MB:.0f} MB"
    assert received > sizes["ckpt/a.bin"] + sizes["ckpt/b.bin"]
    assert b"PK\x05\x06" in tail[-1024:], "the zip ends with its central directory"
    assert os.path.getsize(storage_dir / artifact_file_key(artifact, artifact.files.get(path="ckpt/a.bin"))) == GIB

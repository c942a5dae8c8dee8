"""``Job.sync_checkpoint``, the call the interruption-notice handling makes:
against a small stand-in of the checkpoint endpoints that, like the server,
asks only for files that differ from its latest version. The real server
and runners are in tests/e2e/test_checkpoints.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from trainyard_runner.job import Job
from trainyard_runner.protocol import AssignJob, CheckpointSpec, CodeSpec, JobState


class CheckpointApi:
    def __init__(self) -> None:
        self.latest: dict[str, str] = {}  # path -> sha256 of the latest version
        self.begun: list[list[str]] = []  # the manifest paths of each sync
        self.puts: dict[str, bytes] = {}
        self.refuse_puts = 0
        self.versions = 0
        self._pending: dict[str, dict[str, str]] = {}


@pytest.fixture
def api() -> Iterator[tuple[CheckpointApi, str]]:
    state = CheckpointApi()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if "/complete/" in self.path:
                vid = self.path.split("/artifacts/")[1].split("/")[0]
                state.latest = state._pending.pop(vid)
                return self._json(200, {"number": int(vid[1:]), "latest": True})
            if "/urls/" in self.path:
                return self._json(403, {"message": "no fresh URLs here"})
            state.versions += 1
            vid = f"v{state.versions}"
            files = {f["path"]: f["sha256"] for f in body["files"]}
            state.begun.append(sorted(files))
            state._pending[vid] = files
            changed = [p for p, sha in files.items() if state.latest.get(p) != sha]
            uploads = [{"path": p, "url": f"/put/{vid}/{p}"} for p in changed]
            self._json(
                201, {"id": vid, "number": state.versions, "carried": len(files) - len(changed), "uploads": uploads}
            )

        def do_PUT(self) -> None:
            data = self.rfile.read(int(self.headers["Content-Length"]))
            if state.refuse_puts:
                state.refuse_puts -= 1
                return self._json(403, {"message": "expired"})
            state.puts[self.path] = data
            self._json(200, {})

        def _json(self, status: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}/api/v1"
    server.shutdown()


def _job(tmp_path: Path, api_url: str, checkpoint: CheckpointSpec | None) -> Job:
    spec = AssignJob(job="j1", attempt=1, seq_base=0, lease="l", lease_seconds=15, run_name="r", workflow="w",
                     commands=["true"], env={}, code=CodeSpec(kind="git"), artifacts=[], api_url=api_url,
                     checkpoint=checkpoint)  # fmt: skip

    async def report(_: JobState) -> None:
        pass

    job = Job(
        spec, work_dir=tmp_path, token="tok", report=report, on_logs_ready=lambda: None, on_drain_stuck=lambda: None
    )
    (job.dir / "work" / "ckpt").mkdir(parents=True)
    (job.dir / "tmp").mkdir()
    return job


def test_a_sync_uploads_changed_files_only_and_nothing_when_nothing_changed(
    tmp_path: Path, api: tuple[CheckpointApi, str]
) -> None:
    state, url = api
    job = _job(tmp_path, url, CheckpointSpec(path="./ckpt"))
    ckpt = job.dir / "work" / "ckpt"
    (ckpt / "big.bin").write_bytes(b"b" * 5000)
    (ckpt / "step").write_text("1")

    async def go() -> list[bool]:
        first = await job.sync_checkpoint("rebalance recommendation")
        again = await job.sync_checkpoint("interruption notice")  # nothing changed: no request at all
        (ckpt / "step").write_text("2")
        changed = await job.sync_checkpoint("interruption notice")
        return [first, again, changed]

    assert asyncio.run(go()) == [True, True, True]
    assert state.begun == [["big.bin", "step"], ["big.bin", "step"]]
    assert state.puts == {"/put/v1/big.bin": b"b" * 5000, "/put/v1/step": b"1", "/put/v2/step": b"2"}
    assert state.latest["step"] == hashlib.sha256(b"2").hexdigest()


def test_a_failed_sync_answers_false_and_the_next_one_sends_the_files_again(
    tmp_path: Path, api: tuple[CheckpointApi, str]
) -> None:
    state, url = api
    job = _job(tmp_path, url, CheckpointSpec(path="./ckpt"))
    (job.dir / "work" / "ckpt" / "step").write_text("1")
    state.refuse_puts = 1  # refused with 403; the fresh URL is refused too

    async def go() -> list[bool]:
        return [await job.sync_checkpoint("interruption notice"), await job.sync_checkpoint("periodic")]

    assert asyncio.run(go()) == [False, True]
    assert state.puts == {"/put/v2/step": b"1"}


def test_without_a_checkpoint_there_is_nothing_to_sync(tmp_path: Path, api: tuple[CheckpointApi, str]) -> None:
    state, url = api
    job = _job(tmp_path, url, None)

    assert asyncio.run(job.sync_checkpoint("interruption notice")) is False
    assert state.begun == []


def test_a_file_replaced_while_the_sync_reads_the_directory_is_left_out_not_a_failed_sync(
    tmp_path: Path, api: tuple[CheckpointApi, str]
) -> None:
    """tiny-train's atomic write, state.tmp written then replaced onto
    state.json, in a tight loop beside the syncs: a sync that listed
    state.tmp just before the rename still succeeds, and every version
    holds state.json."""
    state, url = api
    job = _job(tmp_path, url, CheckpointSpec(path="./ckpt"))
    ckpt = job.dir / "work" / "ckpt"
    (ckpt / "state.json").write_text("0")
    stop = threading.Event()

    def train() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            tmp = ckpt / "state.tmp"
            tmp.write_text(str(step) * 200)
            tmp.replace(ckpt / "state.json")

    writer = threading.Thread(target=train)
    writer.start()

    async def go() -> list[bool]:
        return [await job.sync_checkpoint("periodic") for _ in range(150)]

    try:
        results = asyncio.run(go())
    finally:
        stop.set()
        writer.join()
    assert all(results), f"{results.count(False)} of {len(results)} syncs failed"
    assert state.begun and all("state.json" in paths for paths in state.begun)

"""A real runner process uploads a job's artifact through a server outage
(tests/support/flaky_storage.py answers 503 for a while): it keeps trying
with backoff and the upload succeeds; when the outage outlasts the retry
budget, the job fails and its files are kept where its reason says, the
heartbeats say until when, and they are uploaded once storage answers again
(or removed once their time is up), and the server is told which."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import serve

from tests.runner.test_agent import TOKEN, FakeServer, assign, start_runner, stop
from tests.support.flaky_storage import FlakyStorage

MODEL = b"trained weights " * 1000


@pytest.fixture
def flaky() -> Iterator[FlakyStorage]:
    server = FlakyStorage().start()
    yield server
    server.stop()


def _job(repo: tuple[Path, str], api_url: str) -> dict[str, Any]:
    job = assign("j", ["mkdir -p model", f"printf '{MODEL.decode()}' > model/w.bin"], repo)
    return {**job, "artifacts": [{"path": "./model"}], "api_url": api_url}


def _finals(server: FakeServer, job: str) -> list[dict[str, Any]]:
    return [
        m
        for m in server.received
        if m["type"] == "job_state" and m["job"] == job and m["state"] in ("succeeded", "failed")
    ]


def _run(work: Path, job: dict[str, Any], *flags: str, timeout: float = 60) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], work, *flags, api_url=job["api_url"])
            try:
                await server.to_send.put(job)
                await server.wait_for(lambda: bool(_finals(server, job["job"])), timeout)
                # Killed between sending the final state and removing the job's
                # directory, a runner leaves the job for the next one to re-attach
                # to and report again (busy with it, that one would refuse the next).
                await server.wait_for(lambda: not (work / "jobs" / job["job"]).exists(), 10)
            finally:
                await stop(runner)
        return _finals(server, job["job"])[0]

    return asyncio.run(go())


def test_an_upload_during_an_outage_of_some_seconds_succeeds(
    tmp_path: Path, repo: tuple[Path, str], flaky: FlakyStorage
) -> None:
    flaky.fail_for(4)  # the old runner gave up after ~3 s of 5xx

    final = _run(tmp_path / "rd", _job(repo, flaky.api_url))

    assert (final["state"], final["reason"]) == ("succeeded", "")
    assert flaky.refused >= 3
    assert flaky.stored == {"a1/w.bin": MODEL}
    assert flaky.completed == ["a1"]
    assert not (tmp_path / "rd" / "kept").exists()


def test_an_upload_that_never_succeeds_fails_the_job_and_keeps_its_files_where_the_reason_says(
    tmp_path: Path, repo: tuple[Path, str], flaky: FlakyStorage
) -> None:
    flaky.fail_for(3600)
    started = time.monotonic()

    final = _run(tmp_path / "rd", _job(repo, flaky.api_url), "--retry-seconds", "3")

    assert final["state"] == "failed"
    assert time.monotonic() - started > 3
    match = re.search(
        r"; the job's files are kept on (\S+) in (\S+) until \d{4}-\d\d-\d\d \d\d:\d\d UTC$", final["reason"]
    )
    assert match, final["reason"]
    assert final["reason"].startswith("artifact upload failed: POST http://127.0.0.1:")
    assert "HTTP 503" in final["reason"]
    host, kept = match.groups()
    assert host == socket.gethostname()
    assert Path(kept) == (tmp_path / "rd" / "kept" / "j.1" / "work").resolve()
    assert (Path(kept) / "model" / "w.bin").read_bytes() == MODEL  # the trained model survived the job
    assert not (tmp_path / "rd" / "jobs" / "j" / "work").exists()  # moved, not copied


def test_kept_files_are_removed_once_their_time_is_up(
    tmp_path: Path, repo: tuple[Path, str], flaky: FlakyStorage
) -> None:
    flaky.fail_for(3600)
    # Long enough that the first runner's own sweep after the job (on a busy
    # machine, seconds after the files were kept) cannot already remove them.
    flags = ("--retry-seconds", "1", "--keep-failed-seconds", "8")
    final = _run(tmp_path / "rd", _job(repo, flaky.api_url), *flags)
    first_ended = time.monotonic()
    kept = tmp_path / "rd" / "kept" / "j.1"
    assert final["state"] == "failed"
    assert (kept / "work" / "model" / "w.bin").exists()
    time.sleep(max(0.0, first_ended + 8.2 - time.monotonic()))  # kept before the first run ended: now past its time

    # The next job on this runner (a new runner process sweeps at its start, too).
    flaky.fail_until = 0
    again = _run(tmp_path / "rd", {**_job(repo, flaky.api_url), "job": "j2"}, *flags)

    assert again["state"] == "succeeded", again["reason"]
    assert not kept.exists()
    assert [(q.split("?")[0], body) for q, body in flaky.kept_reports] == [
        ("/api/v1/runner/jobs/j/kept/", {"outcome": "removed"})
    ]


def test_kept_files_are_uploaded_once_storage_answers_again_and_the_heartbeats_say_until_when(
    tmp_path: Path, repo: tuple[Path, str], flaky: FlakyStorage
) -> None:
    flaky.fail_for(3600)
    work = tmp_path / "rd"
    kept = work / "kept" / "j.1"

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            flags = ("--retry-seconds", "1", "--kept-retry-seconds", "1")
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], work, *flags, api_url=flaky.api_url)
            try:
                await server.to_send.put({**_job(repo, flaky.api_url), "job_token": "attempt-token"})
                await server.wait_for(lambda: bool(_finals(server, "j")), 60)
                await server.wait_for(lambda: bool(_beats(server)) and _beats(server)[-1].get("kept_until"), 10)
                assert (kept / "work" / "model" / "w.bin").read_bytes() == MODEL
                held = _beats(server)[-1:]  # a heartbeat while the files are kept
                flaky.fail_until = 0  # storage answers again
                flaky.refuse_kept = 1  # but the first word of it is lost: the files wait for the next one
                await server.wait_for(lambda: bool(flaky.kept_reports), 60)
                seen = len(server.received)
                await server.wait_for(lambda: any(m["type"] == "heartbeat" for m in server.received[seen:]), 10)
                after = [m for m in server.received[seen:] if m["type"] == "heartbeat"]
            finally:
                await stop(runner)
        return _finals(server, "j")[0], held + after

    final, beats = asyncio.run(go())

    assert final["state"] == "failed" and "the job's files are kept on" in final["reason"]
    assert abs(final["kept_until"] - (time.time() + 24 * 3600)) < 120
    assert beats[0]["kept_until"] == final["kept_until"]  # the machine says it holds them
    assert flaky.stored == {"a1/w.bin": MODEL}
    assert flaky.completed == ["a1"]  # uploaded once: only the report was tried again
    assert flaky.refuse_kept == 0 and len(flaky.kept_reports) == 1
    path, body = flaky.kept_reports[0]
    assert (path, body) == ("/api/v1/runner/jobs/j/kept/?attempt=1", {"outcome": "uploaded"})
    assert set(flaky.authorizations) == {f"Bearer {TOKEN}.attempt-token"}  # the kept attempt's own credential
    assert not kept.exists()
    assert "kept_until" not in beats[-1]  # nothing kept: the machine may be retired


def _beats(server: FakeServer) -> list[dict[str, Any]]:
    return [m for m in server.received if m["type"] == "heartbeat"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a file its job's user cannot read needs a root runner")
def test_files_kept_after_a_failure_that_would_fail_again_are_not_retried_nor_hold_the_machine(
    tmp_path: Path, repo: tuple[Path, str], flaky: FlakyStorage
) -> None:
    """A file of the artifact the job's user cannot read: trying again cannot
    help, so the machine is not held for the files (they stay until their time)."""
    work = tmp_path / "rd"
    commands = ["mkdir -p model", "printf w > model/w.bin", "chmod 000 model/w.bin"]
    job = {**assign("j", commands, repo), "artifacts": [{"path": "./model"}]}
    job["api_url"] = flaky.api_url

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        server = FakeServer()
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            flags = ("--kept-retry-seconds", "1")
            runner = await start_runner(ws_server.sockets[0].getsockname()[1], work, *flags, api_url=flaky.api_url)
            try:
                await server.to_send.put(job)
                await server.wait_for(lambda: bool(_finals(server, "j")), 60)
                seen = len(server.received)
                await asyncio.sleep(2.5)  # heartbeats every 0.5 s, and the uploader's next rounds
                after = [m for m in server.received[seen:] if m["type"] == "heartbeat"]
            finally:
                await stop(runner)
        return _finals(server, "j")[0], after

    final, beats = asyncio.run(go())

    assert final["reason"].startswith("cannot read w.bin: Permission denied; the job's files are kept on "), final
    assert final["kept_until"] is not None  # the server still learns where they are, and until when
    assert beats and all("kept_until" not in b for b in beats)
    assert (work / "kept" / "j.1" / "work").is_dir()
    assert flaky.manifests == {} and flaky.kept_reports == []

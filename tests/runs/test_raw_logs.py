"""The raw read-back (``GET …/jobs/<job>/logs/raw``) over the real ASGI
server: the log as plain text, its ranges, tail and timestamps, attempt
marks, lines that are not plain ASCII, and another workspace's job a 404."""

from __future__ import annotations

import io
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend.accounts.models import Workspace
from backend.runs.models import Attempt, AttemptStatus, Job, Run
from backend.runs.services.logarchive import log_archive_job
from backend.runs.services.logchunks import chunks_of, chunks_write
from tests.support.fixtures import Person, submit
from tests.support.web import WebServer, WebServers

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 12, 2, 11, 30, 0, 123456, tzinfo=UTC)


def _store(job: Job, texts: list[str], *, stream: str = "o") -> None:
    first = Job.objects.get(pk=job.pk).last_seq + 1
    lines = [((T0 + timedelta(seconds=i)).timestamp(), stream, text) for i, text in enumerate(texts)]
    chunks_write(str(job.pk), chunks_of(first, lines))
    Job.objects.filter(pk=job.pk).update(last_seq=first + len(texts) - 1)


def _raw(server: WebServer, person: Person, job: Job, workspace: str = "acme", **params: str) -> httpx.Response:
    url = f"{server.url}/api/v1/workspaces/{workspace}/jobs/{job.pk}/logs/raw"
    return httpx.get(url, params=params, headers={"Authorization": f"Bearer {person.token}"}, timeout=30)


@pytest.fixture
def job(run: Run) -> Job:
    found = run.jobs.get()
    _store(found, [f"line {i}" for i in range(1, 11)])
    return found


def test_the_whole_log_comes_back_as_plain_text_in_seq_order(web_server: WebServers, job: Job, member: Person) -> None:
    _store(job, ["warning: to stderr"], stream="e")

    response = _raw(web_server.start(), member, job)

    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert "content-disposition" not in response.headers
    assert response.text == "".join(f"line {i}\n" for i in range(1, 11)) + "warning: to stderr\n"


def test_ranges_by_seq_and_tail_pick_the_lines_asked_for(web_server: WebServers, job: Job, member: Person) -> None:
    server = web_server.start()

    def lines(**params: str) -> list[str]:
        return _raw(server, member, job, **params).text.splitlines()

    assert lines(from_seq="4", to_seq="6") == ["line 4", "line 5", "line 6"]
    assert lines(from_seq="9") == ["line 9", "line 10"]
    assert lines(to_seq="2") == ["line 1", "line 2"]
    assert lines(tail="3") == ["line 8", "line 9", "line 10"]
    assert lines(tail="3", to_seq="5") == ["line 3", "line 4", "line 5"]
    assert lines(tail="50", from_seq="7") == ["line 7", "line 8", "line 9", "line 10"]
    assert lines(tail="0") == []
    assert lines(from_seq="11") == []


def test_timestamps_prefix_each_line_with_its_utc_time(web_server: WebServers, job: Job, member: Person) -> None:
    response = _raw(web_server.start(), member, job, timestamps="1", to_seq="2")

    assert response.text == "2026-12-02T11:30:00.123456Z line 1\n2026-12-02T11:30:01.123456Z line 2\n"


def test_download_names_the_file_after_the_run_and_job(web_server: WebServers, job: Job, member: Person) -> None:
    response = _raw(web_server.start(), member, job, download="1")

    assert response.headers["content-disposition"] == f'attachment; filename="{job.run.name}-{job.name}.log"'


def test_an_archived_log_downloads_from_storage_and_ranges_still_stream(
    web_server: WebServers, job: Job, member: Person, settings: Any, tmp_path: Path
) -> None:
    """The whole log of a job that ran once, once archived: a download is a
    redirect to its object's short-lived URL, whose bytes are the log; a
    range (or a read without download=1) is streamed by the server, from
    the archive."""
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    server = web_server.start(TRAINYARD_STORAGE_DIR=str(tmp_path))
    whole = _raw(server, member, job).content
    Job.objects.filter(pk=job.pk).update(status="succeeded", finished_at=T0)
    assert log_archive_job(job_id=str(job.pk)) is not None

    redirect = _raw(server, member, job, download="1")
    assert redirect.status_code == 302
    assert redirect.headers["location"].startswith(f"{server.url}/storage/")
    fetched = httpx.get(redirect.headers["location"], timeout=30)
    assert fetched.content == whole
    assert fetched.headers["content-disposition"].endswith(f'"{job.run.name}-{job.name}.log"')

    assert _raw(server, member, job).content == whole
    assert _raw(server, member, job, download="1", tail="2").content == b"line 9\nline 10\n"


def _ranged(server: WebServer, person: Person, job: Job, value: str) -> httpx.Response:
    url = f"{server.url}/api/v1/workspaces/acme/jobs/{job.pk}/logs/raw"
    return httpx.get(url, headers={"Authorization": f"Bearer {person.token}", "Range": value}, timeout=30)


def test_a_byte_range_of_the_whole_log_comes_back_as_a_part(
    web_server: WebServers, run: Run, member: Person, settings: Any, tmp_path: Path
) -> None:
    """``Range: bytes=`` (a resumed download, ``curl -r``) over chunk
    boundaries, from chunk rows and once archived: 206 with the exact bytes
    and Content-Range; a suffix; past the end a 416 naming the size."""
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    server = web_server.start(TRAINYARD_STORAGE_DIR=str(tmp_path))
    job = run.jobs.get()
    _store(job, [f"{i:05d} ünï " + "z" * (i % 50) for i in range(1, 2_501)])  # three chunks
    whole = _raw(server, member, job).content
    assert len(whole) > 90_000

    def check() -> None:
        for start, end in ((0, 9), (1000, 60_000), (len(whole) - 5, len(whole) - 1)):
            part = _ranged(server, member, job, f"bytes={start}-{end}")
            assert part.status_code == 206
            assert part.content == whole[start : end + 1]
            assert part.headers["content-range"] == f"bytes {start}-{end}/{len(whole)}"
        assert _ranged(server, member, job, "bytes=-7").content == whole[-7:]
        assert _ranged(server, member, job, "bytes=50000-").content == whole[50_000:]
        past = _ranged(server, member, job, f"bytes={len(whole)}-")
        assert (past.status_code, past.headers["content-range"]) == (416, f"bytes */{len(whole)}")
        assert str(len(whole)) in past.json()["message"]
        assert _ranged(server, member, job, "bytes=5-2").content == whole  # not a range: the whole log
        assert _ranged(server, member, job, f"bytes=0-{10**9}").content == whole  # an end past it is the end

    check()
    Job.objects.filter(pk=job.pk).update(status="succeeded", finished_at=T0)
    assert log_archive_job(job_id=str(job.pk)) is not None
    check()


def test_bad_parameters_are_refused_with_a_message(web_server: WebServers, job: Job, member: Person) -> None:
    server = web_server.start()

    for params, message in [
        ({"tail": "many"}, "tail must be a whole number, not 'many'."),
        ({"tail": "-1"}, "tail must be at least 0."),
        ({"from_seq": "0"}, "from_seq must be at least 1."),
        ({"timestamps": "yes"}, "timestamps must be 0 or 1, not 'yes'."),
    ]:
        response = _raw(server, member, job, **params)
        assert (response.status_code, response.json()["message"]) == (400, message)


def test_text_comes_back_byte_for_byte_as_stored(web_server: WebServers, run: Run, member: Person) -> None:
    job = run.jobs.get()
    # What the runner sends for a job's bytes: invalid UTF-8 already replaced
    # by U+FFFD, "\r" kept, a line past 64 KiB cut into pieces (docs/RUNNER.md).
    texts = [
        "progress 10%\rprogress 50%\rprogress 100%",
        "bad \ufffd byte",
        "é ü 日本 🚀",
        "tab\there \\n not a newline",
        "x" * 65536,
        "y" * 70,
    ]
    _store(job, texts)

    response = _raw(web_server.start(), member, job)

    assert response.content == "".join(t + "\n" for t in texts).encode()


def test_a_log_of_many_batches_comes_back_whole(web_server: WebServers, run: Run, member: Person) -> None:
    job = run.jobs.get()
    _store(job, [f"{i:07d} " + "z" * 100 for i in range(1, 120_001)])  # three batches of 50,000

    response = _raw(web_server.start(), member, job)

    assert response.content.splitlines() == [f"{i:07d} ".encode() + b"z" * 100 for i in range(1, 120_001)]


def test_lines_after_a_gap_in_the_seqs_come_back(web_server: WebServers, job: Job, member: Person) -> None:
    chunks_write(str(job.pk), chunks_of(5_000_000, [(T0.timestamp(), "o", "far after the gap")]))

    response = _raw(web_server.start(), member, job, from_seq="10")

    assert response.text == "line 10\nfar after the gap\n"


def test_attempt_boundaries_are_marked_as_trainyard_logs_marks_them(
    web_server: WebServers, job: Job, member: Person
) -> None:
    common = {"workspace": job.workspace, "job": job, "status": AttemptStatus.ENDED}
    Attempt.objects.create(**common, number=1, first_seq=1, last_seq=4, termination_reason="interrupted")
    Attempt.objects.create(
        **common, number=2, first_seq=5, restored_checkpoint=3, termination_reason="error", termination_message="exit 1"
    )
    server = web_server.start()

    whole = _raw(server, member, job).text.splitlines()
    tail = _raw(server, member, job, tail="2").text.splitlines()

    first = f"--- attempt 1 of {job.name} on - ---"
    second = f"--- attempt 2 of {job.name} on - · resumed from checkpoint 3 ---"
    assert whole == [
        first,
        *[f"line {i}" for i in range(1, 5)],
        "--- attempt 1 ended: interrupted ---",
        second,
        *[f"line {i}" for i in range(5, 11)],
        "--- attempt 2 ended: error (exit 1) ---",
    ]
    assert tail == [second, "line 9", "line 10", "--- attempt 2 ended: error (exit 1) ---"]
    # Its body has marks between the lines: a byte range is not honoured, the whole log comes (HTTP allows it).
    ranged = _ranged(server, member, job, "bytes=0-9")
    assert (ranged.status_code, ranged.text.splitlines()) == (200, whole)


def test_a_job_of_another_workspace_is_not_found(
    web_server: WebServers, job: Job, member: Person, outsider: Person
) -> None:
    theirs = submit(Workspace.objects.get(slug=outsider.user.personal_workspace.slug), outsider.user).jobs.get()
    _store(theirs, ["their secret line"])
    server = web_server.start()

    through_ours = _raw(server, member, theirs)
    through_theirs = _raw(server, outsider, job, workspace=outsider.user.personal_workspace.slug)
    anonymous = httpx.get(f"{server.url}/api/v1/workspaces/acme/jobs/{job.pk}/logs/raw", timeout=30)

    assert (through_ours.status_code, through_ours.json()["message"]) == (404, "Job not found.")
    assert (through_theirs.status_code, through_theirs.json()["message"]) == (404, "Job not found.")
    assert "line 1" not in through_theirs.text and "their secret" not in through_ours.text
    assert anonymous.status_code == 401


def test_raw_log_reads_are_rate_limited_per_user_with_a_clear_429_and_retry_after(
    web_server: WebServers, job: Job, member: Person
) -> None:
    server = web_server.start(
        TRAINYARD_RATE_RAWLOG_USER="3/min", TRAINYARD_CHANNEL_PREFIX=f"raw-{secrets.token_hex(4)}"
    )

    statuses = [_raw(server, member, job).status_code for _ in range(3)]
    refused = _raw(server, member, job, download="1")

    assert statuses == [200, 200, 200]
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.json()["message"].startswith("Too many raw log reads from this account: at most 3 per minute.")
    assert refused.json()["extra"]["scope"] == "rawlog"


def test_the_cli_waits_out_the_raw_log_rate_limit_and_reads_every_log(
    web_server: WebServers, job: Job, member: Person
) -> None:
    """`trainyard logs` of a run of many jobs reads one raw log each: over the
    limit it waits the Retry-After the server names, then reads on."""
    from trainyard.api import Client

    server = web_server.start(TRAINYARD_RATE_RAWLOG_USER="5/2s", TRAINYARD_CHANNEL_PREFIX=f"raw-{secrets.token_hex(4)}")
    client = Client(server.url, member.token, "acme")
    started = time.monotonic()

    logs = []
    for _ in range(6):
        out = io.BytesIO()
        client.job_raw_log(str(job.pk), out)
        logs.append(out.getvalue())

    assert logs == [b"".join(f"line {i}\n".encode() for i in range(1, 11))] * 6
    assert time.monotonic() - started >= 1  # the sixth waited for the window to slide

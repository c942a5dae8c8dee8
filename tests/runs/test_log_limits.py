"""What bounds a job's log: pages bounded by bytes, the per-job cap, the
end-of-log check and retention (backend/runs/services/loglimits.py)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.utils import timezone
from trainyard_runner.protocol import log_digest_hex, log_digest_lines

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.config.asgi import application
from backend.runs.models import Attempt, Job, JobStatus, Run, RunStatus
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.selectors import job_log_lines
from backend.runs.services.logchunks import chunks_of, chunks_write
from backend.runs.services.loglimits import UNCHECKED, logs_check, logs_prune
from backend.runs.services.logs import logs_store
from tests.support.attempts import accept, report
from tests.support.fixtures import Person, submit
from tests.support.frames import frame_lines

MARKER = "[trainyard] log limit of 9.77 KiB reached; further output is dropped"


def _running(team: Workspace, run: Run) -> tuple[Job, Instance]:
    instance = Instance.objects.create(
        workspace=team, backend="local", name="local-test", token_hash="h" * 64, status=InstanceStatus.IDLE,
        cpus=2, memory_bytes=2**30, channel_name="test-channel",
    )  # fmt: skip
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)
    return job, instance


def _text(seq: int, size: int) -> str:
    return f"{seq:06d} " + "x" * (size - 7)


def _store(job: Job, instance: Instance, first: int, count: int, size: int = 100) -> int:
    lines = [(1_800_000_000.0 + i, "o", _text(first + i, size)) for i in range(count)]
    stored = logs_store(job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=first, lines=lines)
    return stored.last_seq


def _pages(owner: Person, job: Job, limit: int = 10_000) -> list[dict[str, Any]]:
    pages, after = [], 0
    while True:
        answer = owner.client().get(f"/api/v1/workspaces/acme/jobs/{job.pk}/logs/?after_seq={after}&limit={limit}")
        assert answer.status_code == 200, answer.content
        pages.append(answer.json())
        if not pages[-1]["has_more"]:
            return pages
        after = pages[-1]["lines"][-1]["seq"]


def test_a_log_page_is_bounded_by_bytes_not_lines_and_the_cursor_reads_everything(
    team: Workspace, run: Run, owner: Person, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOG_PAGE_BYTES": 10_000}
    job, instance = _running(team, run)
    _store(job, instance, 1, 250, size=1000)  # 250 kB, far below the 10,000-line limit
    _store(job, instance, 251, 1, size=50_000)  # one line larger than a page
    _store(job, instance, 252, 3, size=1000)

    pages = _pages(owner, job)

    sizes = [sum(len(line["text"]) for line in page["lines"]) for page in pages]
    assert all(size <= 10_000 for size, page in zip(sizes, pages, strict=True) if len(page["lines"]) > 1)
    assert [len(p["lines"]) for p in pages[:25]] == [10] * 25
    assert [line["seq"] for line in pages[25]["lines"]] == [251]  # alone, but never an empty page
    seqs = [line["seq"] for page in pages for line in page["lines"]]
    assert seqs == list(range(1, 255))
    assert [p["has_more"] for p in pages] == [True] * (len(pages) - 1) + [False]


def test_past_the_cap_one_marker_is_stored_later_lines_are_dropped_and_the_job_still_succeeds(
    team: Workspace, run: Run, owner: Person
) -> None:
    Workspace.objects.filter(pk=team.pk).update(log_cap_bytes=10_000)
    job, instance = _running(team, run)

    assert _store(job, instance, 1, 60) == 60  # 6,000 bytes
    assert _store(job, instance, 61, 60) == 120  # crosses the cap at line 101: acknowledged all the same
    assert _store(job, instance, 121, 500) == 620  # nothing of it is stored
    assert report(job, instance.pk, "succeeded", 0)

    stored = [(seq, text) for seq, _, _, text in job_log_lines(job_id=str(job.pk))]
    assert [seq for seq, _ in stored] == list(range(1, 102))
    assert stored[-2][1] == _text(100, 100)
    assert stored[-1] == (101, MARKER)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED and job.last_seq == 620
    assert job.log_note == "log limit of 9.77 KiB reached at line 101: later output was not stored (the job ran on)"
    shown = owner.client().get(f"/api/v1/workspaces/acme/runs/{run.name}/").json()["jobs"][0]
    assert (shown["log_note"], shown["log_bytes"]) == (job.log_note, 10_000)


def test_the_end_of_log_check_flags_a_job_whose_stored_lines_differ_from_what_the_runner_shipped(
    team: Workspace, run: Run, settings: Any, tmp_path: Any
) -> None:
    job, instance = _running(team, run)
    drop = tmp_path / "drop"
    drop.write_text("")
    settings.TRAINYARD = {**settings.TRAINYARD, "TEST_DROP_LOG_BATCHES": str(drop)}
    _store(job, instance, 1, 10)
    shipped = [("o", _text(1 + i, 100)) for i in range(30)]
    digest = log_digest_hex(log_digest_lines(0, shipped))
    assert logs_check(job_id=str(job.pk), attempt=1, lines=10, digest=log_digest_hex(log_digest_lines(0, shipped[:10])))
    drop.write_text("lose the next batch\n")
    _store(job, instance, 11, 10)  # acknowledged, lost
    _store(job, instance, 21, 10)

    assert not logs_check(job_id=str(job.pk), attempt=1, lines=30, digest=digest)

    job.refresh_from_db()
    assert job.log_note == (
        "log check failed for attempt 1: the server received 20 of its 30 lines; the stored log is incomplete"
    )


def test_an_attempt_whose_tally_began_under_protocol_4_is_not_flagged_but_its_count_still_is(
    team: Workspace, run: Run
) -> None:
    job, instance = _running(team, run)
    sum_of_protocol_4 = "ab" * 32  # a 64-digit sum: no CRC continues it
    Attempt.objects.filter(job=job, number=1).update(log_lines=5, log_digest=sum_of_protocol_4)
    Job.objects.filter(pk=job.pk).update(last_seq=5)
    assert logs_check(job_id=str(job.pk), attempt=1, lines=5, digest="0" * 16)
    _store(job, instance, 6, 5)  # a runner of protocol 5 re-attached: the tally goes on, unchecked
    assert Attempt.objects.get(job=job, number=1).log_digest == UNCHECKED
    assert logs_check(job_id=str(job.pk), attempt=1, lines=10, digest="0" * 16)
    job.refresh_from_db()
    assert job.log_note == ""

    assert not logs_check(job_id=str(job.pk), attempt=1, lines=11, digest="0" * 16)
    job.refresh_from_db()
    assert "the server received 10 of its 11 lines" in job.log_note


def test_retention_deletes_only_the_logs_of_finished_runs_jobs_that_ended_long_ago(
    team: Workspace, owner: Person, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOG_RETENTION_DAYS": 90}
    old, recent, unfinished = (submit(team, owner.user) for _ in range(3))
    now = timezone.now()
    for run_, status, ended in (
        (old, RunStatus.SUCCEEDED, now - timedelta(days=91)),
        (recent, RunStatus.FAILED, now - timedelta(days=89)),
        (unfinished, RunStatus.RUNNING, now - timedelta(days=200)),  # another of its jobs still runs
    ):
        Run.objects.filter(pk=run_.pk).update(status=status)
        job = run_.jobs.get()
        Job.objects.filter(pk=job.pk).update(finished_at=ended, last_seq=2)
        chunks_write(str(job.pk), chunks_of(1, [(now.timestamp(), "o", "x")] * 2))

    assert logs_prune(now=now) == 1
    assert logs_prune(now=now) == 0  # done once

    left = {str(j): n for j, n in ((r.jobs.get().pk, len(job_log_lines(job_id=str(r.jobs.get().pk))))
                                   for r in (old, recent, unfinished))}  # fmt: skip
    assert list(left.values()) == [0, 2, 2]
    pruned = old.jobs.get()
    assert pruned.log_note == "log deleted 90 days after the job ended (retention)" and pruned.log_pruned_at


@pytest.mark.parametrize("days", [0])
def test_retention_zero_keeps_logs_forever(team: Workspace, owner: Person, settings: Any, days: int) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOG_RETENTION_DAYS": days}
    run_ = submit(team, owner.user)
    Run.objects.filter(pk=run_.pk).update(status=RunStatus.SUCCEEDED)
    Job.objects.filter(run=run_).update(finished_at=timezone.now() - timedelta(days=3650))
    assert logs_prune() == 0


@pytest.mark.django_db(transaction=True)
def test_a_followers_catch_up_from_storage_comes_in_pages_bounded_by_bytes(
    team: Workspace, run: Run, member: Person, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOG_PAGE_BYTES": 10_000}
    job, instance = _running(team, run)
    _store(job, instance, 1, 35, size=1000)

    async def follow() -> list[dict[str, Any]]:
        ws = WebsocketCommunicator(
            application,
            f"/ws/v1/workspaces/acme/runs/{run.name}/",
            headers=[(b"authorization", f"Bearer {member.token}".encode())],
        )
        await ws.connect()
        frames = [json.loads(await ws.receive_from(timeout=5)) for _ in range(5)]  # the run, then 4 pages
        assert await ws.receive_nothing(timeout=0.5)
        await ws.disconnect()
        return frames

    snapshot, *pages = async_to_sync(follow)()

    assert snapshot["type"] == "run"
    assert [len(frame_lines(page)) for page in pages] == [10, 10, 10, 5]
    assert [line[0] for page in pages for line in frame_lines(page)] == list(range(1, 36))

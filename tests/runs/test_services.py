from __future__ import annotations

import re
from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.core.errors import ApplicationError
from backend.runs.lifecycle.transitions import attempt_end
from backend.runs.models import Job, JobStatus, LogChunk, Run, RunStatus
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.selectors import job_log_lines
from backend.runs.services.logs import UnknownJob, logs_store
from backend.runs.services.runs import run_stop
from tests.support.attempts import accept, current_attempt, report
from tests.support.fixtures import Person, submit


def test_submitting_writes_one_pending_job_and_schedules_after_commit(
    team: Workspace, owner: Person, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        run = submit(team, owner.user)
    assert re.fullmatch(r"[a-z]+-[a-z]+-1", run.name)
    job = run.jobs.get()
    assert (run.status, job.status, job.spec["commands"]) == ("pending", "pending", ["echo hello"])
    assert len(callbacks) == 1


def test_run_numbers_increase_per_workspace(team: Workspace, owner: Person) -> None:
    names = [submit(team, owner.user).name for _ in range(3)]
    assert [n.rsplit("-", 1)[1] for n in names] == ["1", "2", "3"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workflows: [", "workflows.yaml:1"),
        ("workflows:\n  - name: hello\n    provider: bash\n    comands: [x]\n", "unknown key 'comands'"),
        ("workflows:\n  - name: hello\n    provider: bash\n", "commands"),
    ],
)
def test_a_bad_workflow_file_is_refused_and_writes_nothing(
    team: Workspace, owner: Person, text: str, message: str
) -> None:
    with pytest.raises(ApplicationError) as caught:
        submit(team, owner.user, text=text)
    assert message in caught.value.message
    assert caught.value.extra["errors"][0]["file"] == ".trainyard/workflows.yaml"
    assert Run.objects.count() == 0 and Job.objects.count() == 0


def test_an_impossible_gpu_request_waits_with_a_reason(team: Workspace, owner: Person) -> None:
    run = submit(team, owner.user, workflow="big")
    jobs_schedule()
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    assert run.status_reason.startswith(
        "no backend can run this job: local host: 1× V100 requested, this machine has no GPUs"
    )
    assert Instance.objects.count() == 0


def _instance(team: Workspace, status: str = InstanceStatus.IDLE) -> Instance:
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name="local-test",
        token_hash="h" * 64,
        status=status,
        cpus=2,
        memory_bytes=2**30,
        channel_name="test-channel",
    )


def test_a_job_goes_to_an_idle_runner_that_fits(team: Workspace, run: Run) -> None:
    instance = _instance(team)
    result = jobs_schedule()
    job = run.jobs.get()
    instance.refresh_from_db()
    assert result.assigned == [str(job.pk)]
    assert (job.status, job.instance_id, instance.status) == (JobStatus.ASSIGNED, instance.pk, InstanceStatus.BUSY)


def test_accept_needs_the_lease_and_finishing_twice_does_nothing(team: Workspace, run: Run) -> None:
    instance = _instance(team)
    jobs_schedule()
    job = run.jobs.get()
    assert not accept(job, instance.pk, lease="wrong")
    assert accept(job, instance.pk)
    assert report(job, instance.pk, "failed", 3)
    assert not report(job, instance.pk, "succeeded", 0)
    run.refresh_from_db()
    assert (run.status, run.exit_code) == (RunStatus.FAILED, 3)


def test_an_expired_lease_puts_the_job_back(team: Workspace, run: Run) -> None:
    instance = _instance(team)
    jobs_schedule()
    job = run.jobs.get()
    assert attempt_end(attempt_id=str(current_attempt(job).pk), reason=TerminationReason.LEASE_EXPIRED)
    job.refresh_from_db()
    instance.refresh_from_db()
    assert (job.status, job.instance_id, instance.status) == (JobStatus.PENDING, None, InstanceStatus.IDLE)


def test_stopping_a_pending_run_stops_it_at_once(run: Run, owner: Person) -> None:
    stopped = run_stop(run=run, user=owner.user)
    assert stopped.status == RunStatus.STOPPED
    assert run.jobs.get().status_reason == "stopped by olivia"


def test_stopping_a_running_run_waits_for_the_runner(team: Workspace, run: Run, owner: Person) -> None:
    instance = _instance(team)
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)
    assert run_stop(run=run, user=owner.user).status == RunStatus.STOPPING
    report(job, instance.pk, "stopped", -15, "stopped")
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED


def _running_job(team: Workspace, run: Run) -> tuple[Job, Instance]:
    instance = _instance(team)
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)
    return job, instance


def _lines(first: int, count: int) -> list[tuple[float, str, str]]:
    return [(1_800_000_000.0 + i, "o", f"line {first + i}") for i in range(count)]


def test_resent_log_lines_are_stored_once(team: Workspace, run: Run) -> None:
    job, instance = _running_job(team, run)
    first = logs_store(job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=1, lines=_lines(1, 5))
    again = logs_store(job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=3, lines=_lines(3, 6))
    assert (first.last_seq, again.last_seq, again.first_new_seq, len(again.new_lines)) == (5, 8, 6, 3)
    texts = [(seq, text) for seq, _, _, text in job_log_lines(job_id=str(job.pk))]
    assert texts == [(i, f"line {i}") for i in range(1, 9)]


def test_a_batch_after_a_gap_is_not_stored(team: Workspace, run: Run) -> None:
    job, instance = _running_job(team, run)
    stored = logs_store(job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=4, lines=_lines(4, 2))
    assert (stored.last_seq, stored.new_lines) == (0, [])
    assert not LogChunk.objects.filter(job_id=job.pk).exists()


def test_a_runner_cannot_write_another_runners_job_logs(team: Workspace, run: Run) -> None:
    job, _ = _running_job(team, run)
    other = Instance.objects.create(workspace=team, backend="local", name="other", token_hash="o" * 64)
    with pytest.raises(UnknownJob):
        logs_store(job_id=str(job.pk), instance_id=str(other.pk), attempt=1, first_seq=1, lines=_lines(1, 1))


def test_nul_bytes_in_output_are_stored_as_printed(team: Workspace, run: Run) -> None:
    job, instance = _running_job(team, run)
    logs_store(job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=1, lines=[(1.0, "o", "a\x00b")])
    assert job_log_lines(job_id=str(job.pk)) == [(1, 1.0, "o", "a\x00b")]


def test_special_characters_round_trip_through_a_chunk(team: Workspace, run: Run) -> None:
    job, instance = _running_job(team, run)
    texts = ["tab\there", "back\\slash \\N", "cr\rlf", "nul\x00byte", "", "ünïcödé ✓"]
    logs_store(
        job_id=str(job.pk),
        instance_id=str(instance.pk),
        attempt=1,
        first_seq=1,
        lines=[(1_800_000_000.123456, "o", t) for t in texts],
    )
    stored = job_log_lines(job_id=str(job.pk))
    assert [text for _, _, _, text in stored] == texts
    assert stored[0][1] == 1_800_000_000.123456


def test_a_newline_inside_a_line_is_stored_as_a_symbol_and_keeps_every_line(team: Workspace, run: Run) -> None:
    job, instance = _running_job(team, run)
    logs_store(
        job_id=str(job.pk),
        instance_id=str(instance.pk),
        attempt=1,
        first_seq=1,
        lines=[(1.0, "o", "one\ntwo"), (2.0, "o", "three")],
    )
    assert [(seq, text) for seq, _, _, text in job_log_lines(job_id=str(job.pk))] == [
        (1, "one\u2424two"),
        (2, "three"),
    ]

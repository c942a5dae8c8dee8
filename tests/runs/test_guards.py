"""The guards (``utilization_policy``, ``stall``) against the real database:
what a submission stores (the workflow's keys, else the workspace's
defaults), what the runner is sent for ``metrics:``, when the watch stops a
job, and what the retry policy then does (docs/WORKFLOWS.md, "Guards")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.metrics.services.ingest import record_metrics
from backend.runs.models import Attempt, Job, JobStatus, Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.guards import jobs_guard
from backend.runs.services.logs import logs_store
from backend.runs.services.runner_session import runner_job_state
from backend.runs.services.runs import run_stop
from tests.support.attempts import accept, assign_frame, current_attempt, report
from tests.support.fixtures import Person, submit


def workflow(extra: str = "") -> str:
    return "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n" + extra


def _instance(team: Workspace) -> Instance:
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name=f"local-guards-{Instance.objects.count()}",
        token_hash=f"{Instance.objects.count():064d}",
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**30,
        channel_name="test-channel",
    )


def _running(team: Workspace, run: Run, instance: Instance | None = None) -> tuple[Job, Instance]:
    instance = instance or _instance(team)
    jobs_schedule()
    job = run.jobs.get()
    assert accept(job, instance.pk)
    return job, instance


def _quiet_for(job: Job, seconds: int) -> None:
    """The current attempt's commands started ``seconds`` ago and printed nothing since."""
    then = timezone.now() - timedelta(seconds=seconds)
    Attempt.objects.filter(pk=current_attempt(job).pk).update(started_at=then, last_output_at=then)


def _stalling(team: Workspace, owner: Person, stall: str = "{timeout: 1m}", extra: str = "") -> tuple[Job, Instance]:
    """A run of ``train`` with ``stall: <stall>`` (and ``extra`` keys), its job running on a machine."""
    run = submit(team, owner.user, workflow="train", text=workflow(f"    stall: {stall}\n{extra}"))
    return _running(team, run)


def _stopped_by_runner(job: Job, instance: Instance) -> Job:
    """The runner says the attempt the guard stopped has stopped (SIGTERM's exit code); the job afterwards."""
    assert report(job, instance.pk, "stopped", -15, "stopped")
    job.refresh_from_db()
    return job


# ---------------------------------------------------------------- submission


def test_the_workflows_guards_are_stored_on_its_jobs_in_seconds(team: Workspace, owner: Person) -> None:
    text = workflow(
        "    utilization_policy: {min_gpu_utilization: 10, time_window: 30m}\n"
        "    stall: {timeout: 20m, action: restart}\n"
    )
    job = submit(team, owner.user, workflow="train", text=text).jobs.get()
    assert job.placement["utilization_policy"] == {"min_gpu_utilization": 10, "time_window": 1800}
    assert job.placement["stall"] == {"timeout": 1200, "action": "restart"}


def test_a_workspace_default_applies_where_the_workflow_has_no_key_and_off_turns_it_off(
    team: Workspace, owner: Person
) -> None:
    team.guard_defaults = {
        "stall": {"timeout": "20m", "action": "restart"},
        "utilization_policy": {"min_gpu_utilization": 5, "time_window": "1h"},
    }
    team.full_clean()
    team.save()
    plain = submit(team, owner.user, workflow="train", text=workflow()).jobs.get()
    assert plain.placement["stall"] == {"timeout": 1200, "action": "restart"}
    assert plain.placement["utilization_policy"] == {"min_gpu_utilization": 5, "time_window": 3600}
    own = workflow("    stall: {timeout: 5m}\n    utilization_policy: off\n")
    job = submit(team, owner.user, workflow="train", text=own).jobs.get()
    assert job.placement["stall"] == {"timeout": 300, "action": "stop"}
    assert "utilization_policy" not in job.placement


def test_a_workspace_default_does_not_apply_to_a_dev_environment(team: Workspace, owner: Person) -> None:
    team.guard_defaults = {"stall": {"timeout": "20m"}}
    team.save()
    text = "workflows:\n  - {name: box, provider: code}\n  - {name: lab, provider: lab, stall: {timeout: 2h}}\n"
    assert "stall" not in submit(team, owner.user, workflow="box", text=text).jobs.get().placement
    assert submit(team, owner.user, workflow="lab", text=text).jobs.get().placement["stall"]["timeout"] == 7200


def test_a_workspace_default_that_does_not_parse_is_refused_naming_its_key(team: Workspace) -> None:
    team.guard_defaults = {"stall": {"timeout": "soon"}, "utilisation_policy": {}}
    with pytest.raises(ValidationError) as info:
        team.full_clean()
    assert info.value.message_dict["guard_defaults"] == [
        "unknown key 'utilisation_policy'; allowed keys: utilization_policy, stall",
        "stall.timeout: expected a duration such as 30m, 2h or 1d (or off), got 'soon'",
    ]


def test_the_runner_gets_the_metric_patterns_interval_and_cap(team: Workspace, owner: Person) -> None:
    text = workflow(
        "    metrics:\n"
        "      interval: 10s\n"
        "      per_minute: 120\n"
        "      patterns: [{name: loss, regex: 'loss ([0-9.]+)'}]\n"
    )
    run = submit(team, owner.user, workflow="train", text=text)
    _instance(team)
    jobs_schedule()
    frame = assign_frame(run.jobs.get())
    assert [(p.name, p.regex) for p in frame.metrics] == [("loss", "loss ([0-9.]+)")]
    assert (frame.metrics_interval, frame.metrics_per_minute) == (10.0, 120)


def test_without_metrics_the_runner_gets_the_protocols_defaults(team: Workspace, owner: Person) -> None:
    run = submit(team, owner.user, workflow="train", text=workflow())
    _instance(team)
    jobs_schedule()
    frame = assign_frame(run.jobs.get())
    assert (frame.metrics, frame.metrics_interval, frame.metrics_per_minute) == ([], 5.0, 600)


def test_the_dry_run_shows_each_jobs_guards_in_words_and_a_bad_regex_is_refused_at_submission(
    team: Workspace, owner: Person
) -> None:
    team.guard_defaults = {"utilization_policy": {"min_gpu_utilization": 10, "time_window": "30m"}}
    team.save()
    body = {
        "workflow": "train",
        "workflows_file": {
            "path": ".trainyard/workflows.yaml",
            "text": workflow("    stall: {timeout: 20m, action: restart}\n"),
        },
        "code": {"kind": "git", "repo_url": "https://example.com/r.git", "commit": "b" * 40},
    }
    answer = owner.client().post(f"/api/v1/workspaces/{team.slug}/runs/plan/", body, format="json")
    assert answer.status_code == 200, answer.content
    [job] = answer.json()["jobs"]
    assert job["guards"] == [
        "utilization_policy: stopped when every GPU stays below 10% for 30m",
        "stall: restarted from its last checkpoint after 20m without output",
    ]
    assert job["placement"]["stall"] == {"timeout": 1200, "action": "restart"}

    bad = workflow("    metrics: [{name: loss, regex: 'loss [0-9.]+'}]\n")
    answer = owner.client().post(
        f"/api/v1/workspaces/{team.slug}/runs/",
        {**body, "workflows_file": {**body["workflows_file"], "text": bad}},
        format="json",
    )
    assert answer.status_code == 400
    assert (
        ".trainyard/workflows.yaml:5: workflows[0] (train).metrics[0].regex: the regex has no group"
        in answer.content.decode()
    )
    assert not Run.objects.filter(workspace=team).exists()


# ---------------------------------------------------------------- stall


def test_a_job_quiet_past_its_stall_timeout_is_stopped_and_fails_stalled(team: Workspace, owner: Person) -> None:
    job, instance = _stalling(team, owner)
    _quiet_for(job, 50)
    assert jobs_guard() == 0
    _quiet_for(job, 70)
    assert jobs_guard() == 1
    job.refresh_from_db()
    assert (job.status, job.stop_reason) == (JobStatus.STOPPING, "stalled")
    assert jobs_guard() == 0  # told once
    job = _stopped_by_runner(job, instance)
    attempt = current_attempt(job)
    assert (job.status, attempt.termination_reason) == (JobStatus.FAILED, "stalled")
    assert attempt.termination_message.startswith("stalled: no log line and no metric value for 1m10s")
    assert job.status_reason.startswith("stalled: no log line and no metric value for 1m10s (stall timeout 1m)")


def test_the_stall_clock_starts_when_the_runner_says_the_commands_run(team: Workspace, owner: Person) -> None:
    job, instance = _stalling(team, owner)
    Attempt.objects.filter(pk=current_attempt(job).pk).update(started_at=timezone.now() - timedelta(minutes=10))
    assert jobs_guard() == 0  # still preparing (a long environment build, say): not watched
    state = protocol.JobState(job=str(job.pk), attempt=1, state="running")
    runner_job_state(instance_id=str(instance.pk), message=state)
    started = current_attempt(job).last_output_at
    assert started is not None and timezone.now() - started < timedelta(seconds=5)
    assert jobs_guard() == 0
    runner_job_state(instance_id=str(instance.pk), message=state)  # a reattached runner says it again
    assert current_attempt(job).last_output_at == started


def test_a_stored_log_line_keeps_the_job_from_counting_as_stalled(team: Workspace, owner: Person) -> None:
    job, instance = _stalling(team, owner)
    _quiet_for(job, 600)
    logs_store(
        job_id=str(job.pk), instance_id=str(instance.pk), attempt=1, first_seq=1, lines=[(1.8e9, "o", "epoch 3")]
    )
    assert current_attempt(job).last_output_at is not None
    assert jobs_guard() == 0
    Attempt.objects.filter(pk=current_attempt(job).pk).update(last_output_at=timezone.now() - timedelta(seconds=61))
    assert jobs_guard() == 1


def test_restart_gives_the_job_a_new_attempt_counted_against_the_retry_limit(team: Workspace, owner: Person) -> None:
    text = workflow("    checkpoint: ./ckpt\n    stall: {timeout: 1m, action: restart}\n    retry: {limit: 2}\n")
    run = submit(team, owner.user, workflow="train", text=text)
    job, instance = _running(team, run)
    _quiet_for(job, 61)
    assert jobs_guard() == 1
    job = _stopped_by_runner(job, instance)
    assert (job.status, job.stop_reason, job.stop_requested_at) == (JobStatus.PENDING, "", None)
    assert job.status_reason.startswith("restarting from its last checkpoint (attempt 2 of 2): attempt 1 ended: ")
    assert Attempt.objects.get(job=job, number=1).termination_reason == "stalled"

    job, instance = _running(team, run, instance)  # attempt 2, watched afresh
    assert current_attempt(job).number == 2
    assert jobs_guard() == 0
    _quiet_for(job, 61)
    assert jobs_guard() == 1
    job = _stopped_by_runner(job, instance)
    assert job.status == JobStatus.FAILED
    assert job.status_reason.endswith("not restarted: 2 of 2 attempts used (retry: limit)")


def test_stall_with_stop_is_retried_only_when_on_events_names_it(team: Workspace, owner: Person) -> None:
    job, instance = _stalling(team, owner, extra="    retry: {on_events: [stalled], limit: 3}\n")
    _quiet_for(job, 61)
    assert jobs_guard() == 1
    job = _stopped_by_runner(job, instance)
    assert job.status == JobStatus.PENDING
    assert job.status_reason.startswith("retrying (attempt 2 of 3): attempt 1 ended: no output for the stall timeout")


def test_a_person_who_stops_the_job_while_a_guard_restarts_it_has_it_stopped(team: Workspace, owner: Person) -> None:
    job, instance = _stalling(team, owner, "{timeout: 1m, action: restart}")
    _quiet_for(job, 61)
    assert jobs_guard() == 1
    run_stop(run=job.run, user=owner.user)
    job = _stopped_by_runner(job, instance)
    assert (job.status, current_attempt(job).termination_reason) == (JobStatus.STOPPED, "stopped_by_user")


def test_a_job_someone_is_stopping_is_not_taken_over_by_a_guard(team: Workspace, owner: Person) -> None:
    job, instance = _stalling(team, owner, "{timeout: 1m, action: restart}")
    run_stop(run=job.run, user=owner.user)
    _quiet_for(job, 61)
    assert jobs_guard() == 0
    job = _stopped_by_runner(job, instance)
    assert job.status == JobStatus.STOPPED


def test_a_training_value_keeps_a_quiet_log_from_counting_as_stalled(team: Workspace, owner: Person) -> None:
    job, instance = _stalling(team, owner)
    _quiet_for(job, 600)
    value = protocol.TrainingValue(name="loss", value=0.3, step=7, t=timezone.now().timestamp(), source="file")
    assert record_metrics(
        instance_id=str(instance.pk), message=protocol.Metrics(job=str(job.pk), attempt=1, training=[value])
    )
    assert jobs_guard() == 0


# ---------------------------------------------------------------- utilization_policy


def _gpu_samples(job: Job, instance: Instance, utils: list[float], *, every: int = 5, ago: int = 0) -> None:
    """One sample of two GPUs every ``every`` s, the last ``ago`` s ago: GPU 0 at each of ``utils``, GPU 1 idle."""
    end = timezone.now().timestamp() - ago
    samples = [
        protocol.SystemSample(
            t=end - (len(utils) - 1 - i) * every,
            cpu=100,
            rss=2**30,
            gpus=[
                protocol.GpuSample(index=0, util=util, mem_used=2**30, mem_total=16 * 2**30),
                protocol.GpuSample(index=1, util=0, mem_used=0, mem_total=16 * 2**30),
            ],
        )
        for i, util in enumerate(utils)
    ]
    for first in range(0, len(samples), protocol.MAX_SYSTEM_SAMPLES):
        batch = samples[first : first + protocol.MAX_SYSTEM_SAMPLES]
        message = protocol.Metrics(job=str(job.pk), attempt=current_attempt(job).number, system=batch)
        assert record_metrics(instance_id=str(instance.pk), message=message)


def _idle_job(team: Workspace, owner: Person, extra: str = "") -> tuple[Job, Instance]:
    text = workflow("    utilization_policy: {min_gpu_utilization: 10, time_window: 2m}\n" + extra)
    job, instance = _running(team, submit(team, owner.user, workflow="train", text=text))
    Attempt.objects.filter(pk=current_attempt(job).pk).update(started_at=timezone.now() - timedelta(minutes=5))
    return job, instance


def test_gpus_below_the_threshold_for_the_whole_window_stop_the_job_low_gpu_utilization(
    team: Workspace, owner: Person
) -> None:
    job, instance = _idle_job(team, owner)
    _gpu_samples(job, instance, [3.0] * 30)  # 2.5 minutes at 3 %
    assert jobs_guard() == 1
    job = _stopped_by_runner(job, instance)
    attempt = current_attempt(job)
    assert (job.status, attempt.termination_reason) == (JobStatus.FAILED, "low_gpu_utilization")
    assert attempt.termination_message == "every GPU stayed below 10% for 2m (the highest was 3%; utilization_policy)"


def test_one_busy_sample_in_the_window_keeps_the_job(team: Workspace, owner: Person) -> None:
    job, instance = _idle_job(team, owner)
    _gpu_samples(job, instance, [3.0] * 20 + [55.0] + [3.0] * 9)
    assert jobs_guard() == 0
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_samples_that_do_not_cover_the_window_decide_nothing(team: Workspace, owner: Person) -> None:
    job, instance = _idle_job(team, owner)
    _gpu_samples(job, instance, [0.0] * 12)  # only the last minute of the 2 m window
    assert jobs_guard() == 0
    job, instance = _idle_job(team, owner, "    max_price: 9\n")
    _gpu_samples(job, instance, [0.0] * 30, ago=60)  # the samples stopped a minute ago
    assert jobs_guard() == 0


def test_a_job_without_gpu_samples_is_never_stopped_for_idle_gpus(team: Workspace, owner: Person) -> None:
    job, instance = _idle_job(team, owner)
    cpu_only = [protocol.SystemSample(t=timezone.now().timestamp() - i * 5, cpu=90, rss=2**20) for i in range(30)]
    record_metrics(
        instance_id=str(instance.pk), message=protocol.Metrics(job=str(job.pk), attempt=1, system=cpu_only[::-1])
    )
    assert jobs_guard() == 0


def test_low_gpu_utilization_is_retried_when_on_events_names_it(team: Workspace, owner: Person) -> None:
    job, instance = _idle_job(team, owner, "    retry: {on_events: [low_gpu_utilization]}\n")
    _gpu_samples(job, instance, [1.0] * 30)
    assert jobs_guard() == 1
    job = _stopped_by_runner(job, instance)
    assert job.status == JobStatus.PENDING
    assert job.status_reason.startswith("retrying (attempt 2 of 5): attempt 1 ended: the GPUs stayed idle")

"""Placement through scheduling with the fake backend (state only, real
Postgres): the workflow's placement keys filter offers, failed launches block
exactly their scope across passes, every launch attempt is kept and named,
spot_policy auto falls back to on-demand, an interrupted zone is skipped,
max_duration stops a job and idle_duration keeps its machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.clouds.models import (
    AccountStatus,
    BackendKind,
    CloudAccount,
    Instance,
    InstanceReason,
    InstanceStatus,
    OfferBlock,
    Volume,
    VolumeStatus,
)
from backend.clouds.services.accounts import compute_of
from backend.clouds.services.blocks import Blocks
from backend.clouds.services.instances import Facts, instance_connected
from backend.clouds.services.offers import offers_rank
from backend.clouds.services.provisioning import instance_launch_run, instance_terminate_run
from backend.clouds.services.reconcile import clouds_reconcile
from backend.runs.lifecycle.placement import requirements_of
from backend.runs.models import Attempt, Job, JobStatus
from backend.runs.scheduler.offers import back_in_zone, choose, idle_instances_allowed
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.reconcile import _end_attempts_on_ended_instances, _stop_past_max_duration
from tests.support.accounttasks import run_account_tasks
from tests.support.attempts import accept, report
from tests.support.fixtures import Person, submit

GIB = 2**30


def offer(name: str, price: float, **extra: Any) -> dict[str, Any]:
    return {"instance_type": name, "region": "r1", "price_per_hour": price, "cpus": 2, "memory_bytes": 4 * GIB, **extra}


def workflow(**keys: str) -> str:
    lines = "".join(f"    {k}: {v}\n" for k, v in keys.items())
    return "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n" + lines


def _launch_all() -> None:
    for instance in Instance.objects.filter(status=InstanceStatus.PROVISIONING, launched_at=None):
        instance_launch_run(instance_id=str(instance.pk))


def _schedule(passes: int) -> Instance | None:
    """Passes until a machine was launched (None if none was)."""
    for _ in range(passes):
        jobs_schedule()
        _launch_all()
        launched = Instance.objects.filter(status=InstanceStatus.PROVISIONING).exclude(launched_at=None).first()
        if launched is not None:
            return launched
    return None


def _hello(instance: Instance) -> None:
    facts = Facts("box", "10.0.0.1", "test", 2, 4 * GIB, 50 * GIB, [])
    assert instance_connected(instance_id=str(instance.pk), channel_name="c", facts=facts, busy=False)


def _running(job: Job, instance: Instance) -> Job:
    _hello(instance)
    jobs_schedule()
    job.refresh_from_db()
    assert accept(job, instance.pk)
    job.refresh_from_db()
    return job


def _launched_types() -> list[str]:
    return list(Instance.objects.order_by("created_at").values_list("instance_type", flat=True))


@pytest.fixture
def second_account(team: Workspace, tmp_path: Path, script: Path) -> Iterator[Any]:
    made: list[CloudAccount] = []

    def connect(offers: list[dict[str, Any]]) -> CloudAccount:
        config = {"state_dir": str(tmp_path / "state2"), "script_file": str(script), "offers": offers}
        made.append(CloudAccount.objects.create(workspace=team, kind="fake", name="fake-2", config=config))
        return made[-1]

    yield connect
    for account in made:
        for instance in Instance.objects.filter(account=account):
            instance_terminate_run(instance_id=str(instance.pk))
        assert list(compute_of(account).list_managed()) == []


# ------------------------------------------------------------- offer passes


def test_one_attempt_tries_at_most_25_offers_and_names_them_with_their_codes(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer(f"t{n:02}", 0.01 * (n + 1)) for n in range(30)])
    script.write_text(json.dumps({"no_capacity_first": 100}))
    run = submit(team, owner.user, workflow="train", text=workflow())

    assert _schedule(passes=30) is None

    job = run.jobs.get()
    [attempt] = Attempt.objects.filter(job=job)
    assert job.status == JobStatus.FAILED and attempt.termination_reason == "no_capacity"
    assert len(attempt.offers_tried) == 25
    assert [t["offer"].split("/")[3] for t in attempt.offers_tried] == [f"t{n:02}" for n in range(25)]
    assert {(t["outcome"], t["code"]) for t in attempt.offers_tried} == {("no_capacity", "FakeNoCapacity")}
    assert job.status_reason.startswith(
        "no capacity: tried 25 of 30 offers (fake/r1/r1a/t00/on-demand no_capacity FakeNoCapacity, "
    )
    assert Instance.objects.count() == 25


def test_a_quota_error_blocks_its_family_for_10_minutes_across_jobs(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("g.small", 0.1, quota_family="g"), offer("g.big", 0.2, quota_family="g"), offer("m.x", 0.3)])
    error = {"kind": "quota", "code": "VcpuLimitExceeded", "message": "G vCPU quota is 0", "only": ["g"]}
    script.write_text(json.dumps({"launch_error": error}))
    first = submit(team, owner.user, workflow="train", text=workflow())

    instance = _schedule(passes=3)

    assert instance is not None and instance.instance_type == "m.x"
    assert _launched_types() == ["g.small", "m.x"]  # g.big was never tried: its family is blocked
    block = OfferBlock.objects.get()
    assert (block.scope, block.key, block.code) == ("quota", "r1/on-demand/g", "VcpuLimitExceeded")
    assert 595 < (block.until - timezone.now()).total_seconds() <= 600
    second = submit(team, owner.user, workflow="train", text=workflow())
    jobs_schedule()  # the next job goes straight past the blocked family
    requested = Instance.objects.get(requested_for=second.jobs.get())
    assert requested.instance_type == "m.x"
    assert first.jobs.get().status == JobStatus.PENDING


def test_no_capacity_in_a_zone_skips_the_zone_for_3_minutes(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1, zone="r1a"), offer("b", 0.2, zone="r1a"), offer("c", 0.3, zone="r1b")])
    error = {"kind": "no_capacity", "code": "InsufficientInstanceCapacity", "message": "none", "scope": "zone"}
    script.write_text(json.dumps({"launch_error": {**error, "only": ["r1a"]}}))
    submit(team, owner.user, workflow="train", text=workflow())

    instance = _schedule(passes=3)

    assert instance is not None and instance.zone == "r1b"
    assert _launched_types() == ["a", "c"]
    block = OfferBlock.objects.get()
    assert (block.scope, block.key) == ("zone", "r1/r1a")
    assert 175 < (block.until - timezone.now()).total_seconds() <= 180


def test_an_account_error_breaks_that_account_and_the_pass_uses_another(
    fake_account: Any, second_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    broken = fake_account([offer("cheap", 0.1)])
    other = second_account([offer("dear", 0.5)])
    error = {"kind": "auth", "code": "UnauthorizedOperation", "message": "ec2:RunInstances denied", "only": ["cheap"]}
    script.write_text(json.dumps({"launch_error": error}))
    submit(team, owner.user, workflow="train", text=workflow())

    instance = _schedule(passes=3)

    assert instance is not None and (instance.account_id, instance.instance_type) == (other.pk, "dear")
    broken.refresh_from_db()
    assert broken.status == AccountStatus.BROKEN
    assert "UnauthorizedOperation" in broken.status_reason


def test_when_every_offer_is_blocked_the_job_waits_pending_saying_until_when(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1), offer("b", 0.2)])
    script.write_text(json.dumps({"no_capacity": ["a", "b"]}))
    submit(team, owner.user, workflow="train", text=workflow())
    _schedule(passes=3)  # the first job fails (default policy) and leaves both offers blocked
    second = submit(team, owner.user, workflow="train", text=workflow()).jobs.get()

    jobs_schedule()

    second.refresh_from_db()
    assert second.status == JobStatus.PENDING and second.attempt == 0
    assert second.status_reason.startswith("waiting for capacity: all 2 offers are blocked (offer fake/r1/r1a/")
    assert "the first is free again in 1" in second.status_reason
    assert Instance.objects.filter(requested_for=second).count() == 0


def test_no_capacity_attempts_back_off_15_then_30_then_60_seconds(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1)])
    script.write_text(json.dumps({"no_capacity": ["a"]}))
    job = submit(team, owner.user, workflow="train", text=workflow(retry="{on_events: [no_capacity]}")).jobs.get()
    waits = []
    for number in (1, 2, 3):
        _schedule(passes=2)
        job.refresh_from_db()
        assert Attempt.objects.filter(job=job).count() == number
        jobs_schedule()  # inside the back-off: nothing new, the reason says how long
        job.refresh_from_db()
        waits.append(job.status_reason.rsplit(" in ", 1)[1])
        assert Attempt.objects.filter(job=job).count() == number
        Attempt.objects.filter(job=job).update(finished_at=timezone.now() - timedelta(seconds=61))
        OfferBlock.objects.all().delete()
    assert [int(w.rstrip("s")) for w in waits] in ([15, 30, 60], [14, 29, 59], [15, 30, 59])


# ---------------------------------------------------------------- filters


def test_max_price_leaves_out_dearer_offers(fake_account: Any, script: Path, team: Workspace, owner: Person) -> None:
    fake_account([offer("a", 0.1), offer("b", 0.5), offer("c", 1.0)])
    script.write_text(json.dumps({"no_capacity": ["a"]}))
    job = submit(team, owner.user, workflow="train", text=workflow(max_price="0.6")).jobs.get()
    instance = _schedule(passes=3)
    assert instance is not None and instance.instance_type == "b"
    assert _launched_types() == ["a", "b"]
    too_cheap = submit(team, owner.user, workflow="train", text=workflow(max_price="0.05")).jobs.get()
    jobs_schedule()
    too_cheap.refresh_from_db()
    assert too_cheap.status_reason == (
        "no backend can run this job: no offer matches its placement (on-demand, at most $0.05/h)"
    )
    assert job.pk != too_cheap.pk


def test_regions_keep_to_the_regions_named(fake_account: Any, team: Workspace, owner: Person) -> None:
    fake_account([offer("a", 0.1), offer("b", 0.5, region="r2")])
    submit(team, owner.user, workflow="train", text=workflow(regions="[r2]"))
    instance = _schedule(passes=1)
    assert instance is not None and (instance.region, instance.instance_type) == ("r2", "b")


def test_backends_fake_never_uses_the_local_backend(
    fake_account: Any, team: Workspace, owner: Person, settings: Any
) -> None:
    fake_account([offer("a", 0.5)])
    shapes = [{"name": "box", "cpus": 2, "memory_bytes": 4 * GIB, "disk_bytes": 50 * GIB}]
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": True, "LOCAL_SHAPES": shapes}
    fenced = submit(team, owner.user, workflow="train", text=workflow(backends="[fake]")).jobs.get()
    free = submit(team, owner.user, workflow="train", text=workflow()).jobs.get()

    jobs_schedule()  # launches would run on commit; the rows say what was asked for

    requested = {i.requested_for_id: i.backend for i in Instance.objects.all()}
    assert requested == {fenced.pk: "fake", free.pk: "local"}  # local (free) is cheaper, unless fenced out


def test_a_backend_without_an_account_says_so(fake_account: Any, team: Workspace, owner: Person) -> None:
    fake_account([offer("a", 0.1)])
    job = submit(team, owner.user, workflow="train", text=workflow(backends="[aws]")).jobs.get()
    jobs_schedule()
    job.refresh_from_db()
    assert job.status_reason == (
        "waiting for a runner: no aws account is connected to this workspace (the workflow's backends)"
    )


# ------------------------------------------------------------------ spot auto


def test_auto_tries_spot_first_and_switches_to_on_demand_when_every_spot_offer_failed(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.05, spot=True), offer("b", 0.04, spot=True), offer("a", 0.2)])
    script.write_text(json.dumps({"no_capacity": ["fake/r1/r1a/a/spot", "fake/r1/r1a/b/spot"]}))
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="auto")).jobs.get()

    instance = _schedule(passes=4)

    assert instance is not None and (instance.instance_type, instance.spot) == ("a", False)
    assert list(Instance.objects.order_by("created_at").values_list("instance_type", "spot")) == [
        ("b", True),
        ("a", True),
        ("a", False),
    ]
    job = _running(job, instance)
    assert job.placement_note == "switched to on-demand: every spot offer (2) was tried or is blocked"
    attempt = Attempt.objects.get(job=job)
    assert [t["outcome"] for t in attempt.offers_tried] == [
        "switched_to_on_demand",
        "no_capacity",
        "no_capacity",
        "launched",
    ]
    assert attempt.offers_tried[0]["message"] == job.placement_note


def test_when_auto_found_no_capacity_in_either_market_the_reason_counts_each_market_apart(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.05, spot=True), offer("b", 0.04, spot=True), offer("a", 0.2)])
    script.write_text(json.dumps({"no_capacity_first": 100}))
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="auto")).jobs.get()

    assert _schedule(passes=6) is None

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.status_reason.startswith(
        "no capacity: tried 2 spot offers, then 1 of 1 on-demand offers (fake/r1/r1a/b/spot no_capacity"
    ), job.status_reason
    assert "switched to on-demand: every spot offer (2) was tried or is blocked" in job.status_reason


def test_auto_switches_to_on_demand_after_max_wait(fake_account: Any, team: Workspace, owner: Person) -> None:
    fake_account([offer("a", 0.05, spot=True), offer("a", 0.2)])
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="auto", max_wait="1m")).jobs.get()
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(seconds=61))

    instance = _schedule(passes=1)

    assert instance is not None and not instance.spot
    job.refresh_from_db()
    assert job.on_demand_since is not None
    assert job.placement_note.startswith("switched to on-demand: no spot machine after waiting 6")
    assert job.placement_note.endswith("(max_wait 60s)")


def test_auto_switching_after_max_wait_once_25_spot_offers_failed_launches_on_demand_not_a_failure(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    """The attempt's 25 offers are spent on spot when max_wait runs out: the
    on-demand offers get a budget of their own in the same attempt (the AWS
    end-to-end test met this on a fast machine: 25 spot launches in 20 s)."""
    spot = [offer(f"s{n:02}", 0.01 * (n + 1), spot=True) for n in range(30)]
    fake_account([*spot, offer("d", 0.5)])
    script.write_text(json.dumps({"no_capacity": [f"fake/r1/r1a/s{n:02}/spot" for n in range(30)]}))
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="auto", max_wait="1m")).jobs.get()
    assert _schedule(passes=25) is None  # 25 spot offers tried, none had capacity
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(seconds=61))

    instance = _schedule(passes=1)

    job.refresh_from_db()
    assert job.status == JobStatus.PENDING, job.status_reason
    assert instance is not None and (instance.instance_type, instance.spot) == ("d", False)
    assert job.placement_note.startswith("switched to on-demand: no spot machine after waiting 6")
    assert Attempt.objects.filter(job=job).count() == 0  # the same (first) attempt, not a retry


def test_auto_takes_spot_while_max_wait_lasts(fake_account: Any, team: Workspace, owner: Person) -> None:
    fake_account([offer("a", 0.05, spot=True), offer("a", 0.2)])
    submit(team, owner.user, workflow="train", text=workflow(spot_policy="auto"))
    instance = _schedule(passes=1)
    assert instance is not None and instance.spot


def test_max_wait_keeps_a_job_waiting_for_capacity_then_fails_it(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1)])
    script.write_text(json.dumps({"no_capacity": ["a"]}))
    job = submit(team, owner.user, workflow="train", text=workflow(max_wait="10m")).jobs.get()

    _schedule(passes=2)

    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert "; waiting for capacity (" in job.status_reason and "of max_wait 600s left)" in job.status_reason
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(seconds=601))
    Attempt.objects.filter(job=job).update(finished_at=timezone.now() - timedelta(seconds=20))
    OfferBlock.objects.all().delete()
    _schedule(passes=2)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.status_reason.endswith("s for capacity (max_wait 600s)")


# --------------------------------------------------------- zone, duration, idle


def test_after_an_interruption_the_next_attempt_skips_that_zone_for_3_minutes(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake = fake_account([offer("a", 0.1, zone="r1a", spot=True), offer("b", 0.2, zone="r1b", spot=True)])
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="spot")).jobs.get()
    first = _schedule(passes=1)
    assert first is not None and first.zone == "r1a"
    job = _running(job, first)
    script.write_text(json.dumps({"interrupt": {first.idempotency_key: 0}}))
    compute_of(fake).sync()
    Instance.objects.filter(pk=first.pk).update(status=InstanceStatus.UNREACHABLE, unreachable_since=timezone.now())

    clouds_reconcile()

    run_account_tasks()
    _end_attempts_on_ended_instances()
    second = _schedule(passes=1)

    assert Attempt.objects.get(job=job, number=1).termination_reason == "interrupted"
    assert second is not None and second.zone == "r1b"  # r1a is cheaper, but the job was interrupted there
    ranked = offers_rank(workspace_id=team.pk, req=requirements_of(job)).candidates
    later = choose(
        job=job, candidates=ranked, tried=set(), blocks=Blocks({}), now=timezone.now() + timedelta(seconds=181)
    )
    now = choose(job=job, candidates=ranked, tried=set(), blocks=Blocks({}))
    assert [c.offer.zone for c in now.open] == ["r1b"]
    assert now.blocked[0].startswith("zone r1a skipped 1") and now.blocked[0].endswith("s more (interrupted there)")
    assert [c.offer.zone for c in later.open] == ["r1a", "r1b"]  # 3 minutes on, r1a is back


def test_after_an_interruption_on_a_machine_without_a_zone_the_next_attempt_skips_nothing(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    """Offers with no zone (a Kubernetes cluster's pods): an interruption
    names no zone to avoid, so the next attempt takes the cheapest offer at
    once rather than skipping every offer of the account for 3 minutes."""
    fake = fake_account([offer("a", 0.1, zone="", spot=True), offer("b", 0.2, zone="", spot=True)])
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="spot")).jobs.get()
    first = _schedule(passes=1)
    assert first is not None and (first.instance_type, first.zone) == ("a", "")
    job = _running(job, first)
    script.write_text(json.dumps({"interrupt": {first.idempotency_key: 0}}))
    compute_of(fake).sync()
    Instance.objects.filter(pk=first.pk).update(status=InstanceStatus.UNREACHABLE, unreachable_since=timezone.now())

    clouds_reconcile()

    run_account_tasks()
    _end_attempts_on_ended_instances()
    second = _schedule(passes=1)

    assert Attempt.objects.get(job=job, number=1).termination_reason == "interrupted"
    assert second is not None and second.pk != first.pk and second.instance_type == "a"
    ranked = offers_rank(workspace_id=team.pk, req=requirements_of(job)).candidates
    now = choose(job=job, candidates=ranked, tried=set(), blocks=Blocks({}))
    assert [c.offer.instance_type for c in now.open] == ["a", "b"] and now.blocked == []


def test_a_job_pinned_by_its_volume_to_the_zone_it_was_interrupted_in_goes_back_to_it_saying_why(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake = fake_account([offer("a", 0.1, zone="r1a", spot=True), offer("b", 0.2, zone="r1b", spot=True)])
    job = submit(team, owner.user, workflow="train", text=workflow(spot_policy="spot")).jobs.get()
    first = _schedule(passes=1)
    assert first is not None and first.zone == "r1a"
    job = _running(job, first)
    script.write_text(json.dumps({"interrupt": {first.idempotency_key: 0}}))
    compute_of(fake).sync()
    Instance.objects.filter(pk=first.pk).update(status=InstanceStatus.UNREACHABLE, unreachable_since=timezone.now())
    clouds_reconcile()
    run_account_tasks()
    _end_attempts_on_ended_instances()
    job.refresh_from_db()
    assert Attempt.objects.get(job=job, number=1).termination_reason == "interrupted"
    ranked = offers_rank(workspace_id=team.pk, req=requirements_of(job)).candidates
    pinned = [c for c in ranked if c.offer.zone == "r1a"]  # what capacity() leaves it: offers where the volume is

    # The volume "keep" is in r1a: the only zone the job can run in.
    Volume.objects.create(
        workspace=team,
        name="keep",
        backend=BackendKind.AWS,
        account=first.account,
        region="r1",
        zone="r1a",
        size_bytes=GIB,
        backend_id="vol-0123456789abcdef0",
        status=VolumeStatus.AVAILABLE,
    )
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "volumes": [{"name": "keep", "path": "/keep"}]})
    job.refresh_from_db()
    back = choose(job=job, candidates=pinned, tried=set(), blocks=Blocks({}))

    assert [c.offer.zone for c in back.open] == ["r1a"] and back.blocked == []
    assert back.note == "back in zone r1a, where it was interrupted: its volume keep is there"
    assert back_in_zone(job, account_id=str(first.account_id), region="r1", zone="r1a") == back.note
    other = choose(job=job, candidates=ranked, tried=set(), blocks=Blocks({}))
    assert [c.offer.zone for c in other.open] == ["r1a", "r1b"]  # r1a is not skipped for it
    assert Instance.objects.filter(idle_instances_allowed(job), pk=first.pk).exists()  # nor its idle machines


def test_max_duration_stops_the_job_and_fails_it_with_the_reason(
    fake_account: Any, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1)])
    job = submit(team, owner.user, workflow="train", text=workflow(max_duration="1h")).jobs.get()
    instance = _schedule(passes=1)
    assert instance is not None
    job = _running(job, instance)
    assert _stop_past_max_duration() == 0  # not yet
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=3601))

    assert _stop_past_max_duration() == 1
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPING
    assert report(job, instance.pk, "stopped", -15)

    job.refresh_from_db()
    attempt = Attempt.objects.get(job=job)
    assert (job.status, attempt.termination_reason) == (JobStatus.FAILED, "max_duration")
    assert job.status_reason == "max_duration reached: the job ran longer than 3600s (max_duration in the workflow)"
    assert job.run.status == "failed"


@pytest.mark.parametrize(("idle_duration", "idle_for", "retired"), [("30s", 31, True), ("10m", 301, False)])
def test_idle_duration_keeps_the_machine_that_long_then_retires_it(
    fake_account: Any, team: Workspace, owner: Person, idle_duration: str, idle_for: int, retired: bool
) -> None:
    fake_account([offer("a", 0.1)])
    job = submit(team, owner.user, workflow="train", text=workflow(idle_duration=idle_duration)).jobs.get()
    instance = _schedule(passes=1)
    assert instance is not None
    job = _running(job, instance)
    report(job, instance.pk, "succeeded", 0)
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.IDLE
    Instance.objects.filter(pk=instance.pk).update(
        idle_since=timezone.now() - timedelta(seconds=idle_for), last_heartbeat_at=timezone.now()
    )

    clouds_reconcile()

    run_account_tasks()

    instance.refresh_from_db()
    if retired:
        assert (instance.status, instance.termination_reason) == (
            InstanceStatus.TERMINATING,
            InstanceReason.IDLE_RETIRED,
        )
        assert instance.status_reason == "retired after 30s idle"
    else:
        assert instance.status == InstanceStatus.IDLE  # past the backend's 300 s, within the job's 10 min


def test_idle_duration_off_never_retires_the_machine(fake_account: Any, team: Workspace, owner: Person) -> None:
    fake_account([offer("a", 0.1)])
    job = submit(team, owner.user, workflow="train", text=workflow(idle_duration="off")).jobs.get()
    instance = _schedule(passes=1)
    assert instance is not None
    job = _running(job, instance)
    report(job, instance.pk, "succeeded", 0)
    Instance.objects.filter(pk=instance.pk).update(
        idle_since=timezone.now() - timedelta(days=3), last_heartbeat_at=timezone.now()
    )
    clouds_reconcile()
    run_account_tasks()
    assert Instance.objects.get(pk=instance.pk).status == InstanceStatus.IDLE


# ------------------------------------------------------------------------ API


def _body(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "workflow": "train",
        "workflows_file": {"path": ".trainyard/workflows.yaml", "text": text},
        "code": {"kind": "git", "repo_url": "https://example.com/r.git", "commit": "b" * 40},
        **extra,
    }


def test_the_run_answer_has_the_plan_and_the_overrides_win_over_the_workflow(
    fake_account: Any, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1), offer("b", 0.3, spot=True), offer("c", 0.2, region="r2")])
    text = workflow(regions="[r2]", idle_duration="1h")
    overrides = {"regions": ["r1"], "spot_policy": "spot", "max_price": 1.0, "backends": ["fake"]}

    answer = owner.client().post(
        f"/api/v1/workspaces/{team.slug}/runs/", _body(text, placement=overrides), format="json"
    )

    assert answer.status_code == 201, answer.content
    plan = answer.json()["plan"]
    assert plan == [
        {
            "job": "train",
            "offer": {
                "offers": 1,
                "backend": "fake",
                "instance_type": "b",
                "region": "r1",
                "spot": True,
                "price_per_hour": 0.3,
                "storage_price_per_hour": 0.0,  # a fake offer names no storage price
                "gpus": [],  # the exact GPU models of the offer: none here
            },
            "max_cost": None,  # no max_duration: unbounded
        }
    ]
    assert answer.json()["estimate"] is None
    job = Job.objects.get(run__name=answer.json()["name"])
    assert job.placement == {**overrides, "idle_duration": 3600}
    assert answer.json()["jobs"][0]["placement"] == job.placement


def test_the_dry_run_names_each_jobs_cheapest_offer(fake_account: Any, team: Workspace, owner: Person) -> None:
    fake_account([offer("a", 0.1), offer("b", 0.3)])
    answer = owner.client().post(
        f"/api/v1/workspaces/{team.slug}/runs/plan/", _body(workflow(max_price="0.05")), format="json"
    )
    assert answer.status_code == 200, answer.content
    [job] = answer.json()["jobs"]
    assert job["offer"] == {"offers": 0, "reason": "no offer matches its placement (on-demand, at most $0.05/h)"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"backends": ["asw"]}, "backends"), ({"spot_policy": "cheap"}, "spot_policy"), ({"max_price": 0}, "max_price")],
)
def test_a_bad_override_is_refused_and_writes_nothing(
    fake_account: Any, team: Workspace, owner: Person, overrides: dict[str, Any], field: str
) -> None:
    answer = owner.client().post(
        f"/api/v1/workspaces/{team.slug}/runs/", _body(workflow(), placement=overrides), format="json"
    )
    assert answer.status_code == 400
    assert field in json.dumps(answer.json())
    assert Job.objects.count() == 0


def test_a_machine_that_comes_up_during_a_pass_is_left_to_the_next_pass_not_doubled(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    """The runner's hello lands between the pass's look for an idle machine
    and its capacity check: no second machine is launched for the job (one
    was, in the spot benchmark); the next pass assigns the one that came up."""
    from django.db import transaction

    from backend.runs.scheduler.capacity import capacity

    fake_account([offer("a", 0.1)])
    job = submit(team, owner.user, workflow="train", text=workflow()).jobs.get()
    jobs_schedule()
    _launch_all()
    [first] = Instance.objects.all()
    _hello(first)  # as if during the pass, after its claim found nothing
    with transaction.atomic():
        reason, requested = capacity(job)
    assert requested is None and reason == f"{first.name} is ready for it"
    assert Instance.objects.count() == 1
    jobs_schedule()
    job.refresh_from_db()
    assert (job.status, job.instance_id) == (JobStatus.ASSIGNED, first.pk)

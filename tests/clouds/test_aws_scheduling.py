"""Capacity, quota and account errors of EC2 through scheduling, in process:
real Postgres, the aws backend on moto's server over HTTP (faults injected
by tests/support/moto_server.py), the shipped catalog, no stack.

A workspace has an aws account (the row as the connect flow writes it: its
config names the regions, the bucket and an AMI; its keys encrypted) and a
job that needs a small CPU machine on spot. The launch task's work
(``instance_launch_run``) runs in the test; a runner's hello is played with
``instance_connected``. A job with a volume the cloud will not attach ends
its attempt at once with why. Every test terminates what it launched, and the
``aws`` fixture fails it if anything of ours is left running in moto."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.clouds.backends.aws.errors import quota_name
from backend.clouds.backends.base import CloudState
from backend.clouds.models import (
    AccountStatus,
    BackendKind,
    CloudAccount,
    Instance,
    InstanceReason,
    InstanceStatus,
    OfferBlock,
)
from backend.clouds.services.accounts import compute_of
from backend.clouds.services.facts import accounts_refresh_facts
from backend.clouds.services.instances import (
    Facts,
    handle_of,
    instance_connected,
    instance_request_termination,
)
from backend.clouds.services.offers import offers_rank
from backend.clouds.services.provisioning import instance_launch_run, instance_terminate_run
from backend.clouds.services.reconcile import clouds_reconcile
from backend.clouds.services.volumes import volume_create
from backend.runs.lifecycle.placement import requirements_of
from backend.runs.models import Attempt, Job, JobStatus
from backend.runs.scheduler.passes import jobs_schedule
from backend.vault.crypto import encrypt
from tests.clouds.subjects import MOTO_SDA1_AMI
from tests.support.accounttasks import run_account_tasks
from tests.support.aws_account import admin, prepare
from tests.support.fixtures import Person, submit
from tests.support.moto import MotoServer

GIB = 2**30
REGION = "us-east-1"
BUCKET = "ty-sched-artifacts"
SMALL_CPU = (
    "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n"
    "    resources: {cpu: 2, memory: 4GB}\n    backends: [aws]\n    spot_policy: spot\n"
)


@pytest.fixture
def connect(aws: MotoServer, team: Workspace, settings: Any) -> Iterator[Callable[..., CloudAccount]]:
    """Connects aws accounts to ``team`` (the local backend off); at the end
    terminates every machine launched for them."""
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}
    prepare(aws, regions=[REGION], bucket=BUCKET)
    made: list[CloudAccount] = []

    def connect(name: str = "aws") -> CloudAccount:
        credentials = {"access_key_id": "testing", "secret_access_key": "testing"}
        made.append(
            CloudAccount.objects.create(
                workspace=team,
                kind=BackendKind.AWS,
                name=name,
                config={
                    "regions": [REGION],
                    "bucket": BUCKET,
                    "amis": {REGION: MOTO_SDA1_AMI},
                    "gpu_amis": {REGION: MOTO_SDA1_AMI},
                },
                credentials_ciphertext=encrypt(json.dumps(credentials)),
            )
        )
        return made[-1]

    yield connect
    for instance in Instance.objects.filter(account__in=made).exclude(backend_id=""):
        instance_request_termination(instance_id=str(instance.pk), reason=InstanceReason.TERMINATED, message="test")
        for _ in range(20):
            if instance_terminate_run(instance_id=str(instance.pk)) is None:
                break


def _launch_all() -> list[str]:
    """The launch task's work for every row not launched yet; their outcomes."""
    return [
        instance_launch_run(instance_id=str(i.pk)).status
        for i in Instance.objects.filter(status=InstanceStatus.PROVISIONING, launched_at=None).order_by("created_at")
    ]


def _ranked_types(team: Workspace, job: Job) -> list[str]:
    ranked = offers_rank(workspace_id=team.pk, req=requirements_of(job), backends=("aws",))
    return [c.offer.instance_type for c in ranked.candidates]


def _hello(instance: Instance) -> None:
    facts = Facts("ip-10-0-0-1", "10.0.0.1", "test", 2, 4 * GIB, 100 * GIB, [])
    assert instance_connected(instance_id=str(instance.pk), channel_name="test-channel", facts=facts, busy=False)


def _in_moto(instance: Instance) -> str:
    instance.refresh_from_db()
    return compute_of(instance.account).describe([handle_of(instance)])[instance.idempotency_key]  # type: ignore[arg-type]


def test_no_capacity_for_the_cheapest_offer_launches_the_next_and_the_attempt_lists_both(
    aws: MotoServer, connect: Callable[..., CloudAccount], team: Workspace, owner: Person
) -> None:
    connect()
    run = submit(team, owner.user, workflow="train", text=SMALL_CPU)
    job = run.jobs.get()
    cheapest, second = _ranked_types(team, job)[:2]
    aws.fault("RunInstances", "InsufficientInstanceCapacity", when={"InstanceType": cheapest})

    jobs_schedule()
    assert _launch_all() == ["no_capacity"]
    [failed] = Instance.objects.filter(requested_for=job)
    assert (failed.instance_type, failed.status, failed.termination_reason) == (
        cheapest,
        InstanceStatus.TERMINATED,
        InstanceReason.NO_CAPACITY,
    )
    assert failed.backend_id == "" and aws.fault_hits("RunInstances", "InsufficientInstanceCapacity") == 1
    assert "AWS has no capacity for" in failed.status_reason and cheapest in failed.status_reason

    jobs_schedule()  # the next pass: the next offer, not the one that failed
    assert _launch_all() == ["launched"]
    launched = Instance.objects.get(requested_for=job, status=InstanceStatus.PROVISIONING)
    assert launched.instance_type == second and launched.backend_id.startswith("i-")
    assert _in_moto(launched) in (CloudState.PENDING, CloudState.RUNNING)
    assert [i["InstanceType"] for i in aws.our_instances()] == [second]

    _hello(launched)
    jobs_schedule()
    job.refresh_from_db()
    attempt = Attempt.objects.get(job=job)
    assert (job.status, attempt.instance_id) == (JobStatus.ASSIGNED, launched.pk)
    tried = [(t["offer"], t["outcome"], t["code"]) for t in attempt.offers_tried]
    assert tried == [
        (failed.offer_id, "no_capacity", "InsufficientInstanceCapacity"),
        (launched.offer_id, "launched", ""),
    ]
    assert failed.offer_id.startswith(f"aws/{REGION}/") and cheapest in failed.offer_id
    # What the API (and so `trainyard show`) shows of the attempt.
    answer = owner.client().get(f"/api/v1/workspaces/{team.slug}/runs/{run.name}/")
    assert answer.status_code == 200, answer.content
    [shown] = answer.json()["jobs"][0]["attempts"]
    assert [(t["offer"], t["code"]) for t in shown["offers_tried"]] == [
        (failed.offer_id, "InsufficientInstanceCapacity"),
        (launched.offer_id, ""),
    ]


def test_a_vcpu_quota_error_names_the_quota_and_skips_every_offer_of_that_quota_family(
    aws: MotoServer, connect: Callable[..., CloudAccount], team: Workspace, owner: Person
) -> None:
    connect()
    run = submit(team, owner.user, workflow="train", text=SMALL_CPU)
    job = run.jobs.get()
    ranked = offers_rank(workspace_id=team.pk, req=requirements_of(job), backends=("aws",)).candidates
    cheapest = ranked[0].offer
    same_quota = [c.offer for c in ranked if c.offer.data["quota_family"] == "standard"]
    # c6i, c7i, m6i, r6i, t3…: different prefixes, one vCPU quota (Standard).
    assert len({o.instance_type.split(".")[0] for o in same_quota}) > 3 and cheapest in same_quota
    aws.fault("RunInstances", "VcpuLimitExceeded", when={"InstanceType": cheapest.instance_type})

    jobs_schedule()
    assert _launch_all() == ["no_capacity"]
    [failed] = Instance.objects.filter(requested_for=job)
    quota = quota_name(cheapest.instance_type, REGION, spot=True)
    assert quota == (
        "the account's vCPU quota for Standard (A, C, D, H, I, M, R, T, Z) instances in us-east-1 (Spot), "
        "quota code L-34B43A08"
    )
    assert quota in failed.status_reason and "Service Quotas console" in failed.status_reason
    [block] = OfferBlock.objects.filter(account=failed.account)
    assert (block.scope, block.key, block.code) == ("quota", f"{REGION}/spot/standard", "VcpuLimitExceeded")

    jobs_schedule()
    assert _launch_all() == ["launched"]
    launched = Instance.objects.get(requested_for=job, status=InstanceStatus.PROVISIONING)
    # No other Standard offer was tried: the next launch is of another quota family.
    assert launched.backend_data["offer"]["data"]["quota_family"] != "standard"
    assert Instance.objects.filter(requested_for=job).count() == 2
    assert aws.fault_hits("RunInstances", "VcpuLimitExceeded") == 1
    assert [i["InstanceType"] for i in aws.our_instances()] == [launched.instance_type]


@pytest.mark.parametrize("code", ["UnauthorizedOperation", "AuthFailure"])
def test_an_account_error_marks_the_account_broken_and_the_next_pass_uses_another_account(
    aws: MotoServer, connect: Callable[..., CloudAccount], team: Workspace, owner: Person, code: str
) -> None:
    broken, healthy = connect("aws"), connect("aws-2")
    run = submit(team, owner.user, workflow="train", text=SMALL_CPU)
    job = run.jobs.get()
    aws.fault("RunInstances", code)

    jobs_schedule()
    assert [i.account_id for i in Instance.objects.filter(requested_for=job)] == [broken.pk]  # the oldest first
    assert _launch_all() == ["failed"]
    broken.refresh_from_db()
    assert broken.status == AccountStatus.BROKEN
    assert "ec2:RunInstances in us-east-1" in broken.status_reason
    assert ("add the permission" if code == "UnauthorizedOperation" else "reconnect the account") in (
        broken.status_reason
    )
    [failed] = Instance.objects.filter(requested_for=job)
    assert (failed.status, failed.termination_reason) == (InstanceStatus.TERMINATED, InstanceReason.LAUNCH_FAILED)

    jobs_schedule()
    assert _launch_all() == ["launched"]
    launched = Instance.objects.get(requested_for=job, status=InstanceStatus.PROVISIONING)
    assert launched.account_id == healthy.pk
    assert [i["InstanceId"] for i in aws.our_instances()] == [launched.backend_id]
    assert aws.fault_hits("RunInstances", code) == 1


def test_a_broken_account_alone_leaves_the_job_waiting_with_a_reason_naming_it(
    aws: MotoServer, connect: Callable[..., CloudAccount], team: Workspace, owner: Person
) -> None:
    account = connect("prod-aws")
    run = submit(team, owner.user, workflow="train", text=SMALL_CPU)
    job = run.jobs.get()
    aws.fault("RunInstances", "AuthFailure")

    jobs_schedule()
    assert _launch_all() == ["failed"]
    jobs_schedule()

    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert Instance.objects.filter(requested_for=job).count() == 1  # nothing launched on the broken account
    assert "prod-aws" in job.status_reason and "broken" in job.status_reason, job.status_reason
    account.refresh_from_db()
    assert account.status_reason in job.status_reason


def test_an_instance_ec2_does_not_show_yet_stays_provisioning_and_is_found_when_it_shows(
    aws: MotoServer, connect: Callable[..., CloudAccount], team: Workspace, owner: Person
) -> None:
    connect()
    run = submit(team, owner.user, workflow="train", text=SMALL_CPU)
    jobs_schedule()
    assert _launch_all() == ["launched"]
    instance = Instance.objects.get(requested_for=run.jobs.get())
    # EC2 is eventually consistent: the next DescribeInstances naming the new id do not know it.
    aws.fault("DescribeInstances", "InvalidInstanceID.NotFound", times=2, when={"InstanceIds": instance.backend_id})

    hits = []
    for _ in range(3):
        clouds_reconcile()
        run_account_tasks()
        hits.append(aws.fault_hits("DescribeInstances", "InvalidInstanceID.NotFound"))
        instance.refresh_from_db()
        assert (instance.status, instance.termination_reason) == (InstanceStatus.PROVISIONING, "")
    # The first pass met the fault (the batch, then the id alone: both unknown), the later ones did not.
    assert hits == [2, 2, 2]
    assert not instance.events.filter(to_status__in=[InstanceStatus.LOST, InstanceStatus.TERMINATING]).exists()

    assert _in_moto(instance) == CloudState.RUNNING
    assert [i["InstanceId"] for i in aws.our_instances()] == [instance.backend_id]


def _volume_job(team: Workspace, owner: Person) -> tuple[Job, Instance]:
    """A job with volume ``ckpt`` (made in moto) and the machine launched for it, not connected yet."""
    accounts_refresh_facts()  # the account's zones: a job with a volume runs in its zone
    volume_create(
        workspace=team, user=owner.user, name="ckpt", size="1GB", backend="aws", region=REGION, zone="us-east-1b"
    )
    job = submit(team, owner.user, workflow="train", text=SMALL_CPU + "    volumes: [ckpt:./ckpt]\n").jobs.get()
    jobs_schedule()
    job.refresh_from_db()
    assert _launch_all() == ["launched"], job.status_reason
    return job, Instance.objects.get(requested_for=job)


def test_a_volume_the_cloud_will_not_attach_yet_ends_the_attempt_at_once_and_the_job_waits_again(
    aws: MotoServer,
    connect: Callable[..., CloudAccount],
    team: Workspace,
    owner: Person,
) -> None:
    connect()
    job, instance = _volume_job(team, owner)
    aws.fault("AttachVolume", "RequestLimitExceeded", times=3)

    _hello(instance)

    jobs_schedule()

    job.refresh_from_db()
    [attempt] = Attempt.objects.filter(job=job)
    assert aws.fault_hits("AttachVolume", "RequestLimitExceeded") == 3
    assert attempt.status == "ended" and attempt.termination_reason == "rejected"
    assert attempt.termination_message.startswith("could not attach volume ckpt: "), attempt.termination_message
    assert job.status == JobStatus.PENDING, "back to pending now, not when the lease runs out"

    jobs_schedule()  # the cloud attaches it now: the next attempt is sent

    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.ASSIGNED, 2)
    [attached] = admin(aws, "ec2").describe_volumes(Filters=[{"Name": "tag-key", "Values": ["trainyard:volume"]}])[
        "Volumes"
    ]
    assert [a["InstanceId"] for a in attached["Attachments"]] == [instance.backend_id]


def test_a_volume_the_account_may_not_attach_fails_the_job_with_the_reason(
    aws: MotoServer,
    connect: Callable[..., CloudAccount],
    team: Workspace,
    owner: Person,
) -> None:
    connect()
    job, instance = _volume_job(team, owner)
    aws.fault("AttachVolume", "UnauthorizedOperation", message="not allowed: ec2:AttachVolume", times=5)

    _hello(instance)

    jobs_schedule()

    job.refresh_from_db()
    [attempt] = Attempt.objects.filter(job=job)
    assert (attempt.status, attempt.termination_reason) == ("ended", "error")
    assert job.status == JobStatus.FAILED
    assert "could not attach volume ckpt: " in job.status_reason, job.status_reason
    assert "AttachVolume" in job.status_reason, job.status_reason

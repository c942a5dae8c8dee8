"""An idle machine is given a GPU job only when the GPUs it reports are the
model the job asked for (issue 33): the names ``nvidia-smi`` reports on the
runner (``NVIDIA L40S``) are compared with the job's by the same rule as a
catalog's offers (``backend.clouds.backends.gpus``), never by substring."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.core.redis import redis_client
from backend.runs.models import JobStatus
from backend.runs.wakeups import DIRTY_KEY, QUEUED_KEY
from tests.support.fixtures import Person, submit

pytestmark = pytest.mark.django_db(transaction=True)

GIB = 2**30


def workflows(gpu: str) -> str:
    return f"""\
workflows:
  - name: gpu
    provider: bash
    commands: [nvidia-smi]
    resources:
      gpu: {gpu}
"""


@pytest.fixture(autouse=True)
def _no_requests() -> Iterator[None]:
    redis_client().delete(DIRTY_KEY, QUEUED_KEY, "celery")
    yield
    redis_client().delete(DIRTY_KEY, QUEUED_KEY, "celery")


def _idle(team: Workspace, name: str, gpus: list[tuple[str, int]]) -> Instance:
    """An idle, connected runner reporting ``gpus`` as its hello did (nvidia-smi's names)."""
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name=name,
        token_hash=name.ljust(64, "w"),
        status=InstanceStatus.IDLE,
        cpus=8,
        memory_bytes=64 * GIB,
        channel_name=async_to_sync(get_channel_layer().new_channel)(),
        gpus=[{"name": gpu, "memory_bytes": memory} for gpu, memory in gpus],
    )


@pytest.mark.parametrize(
    ("gpu", "reported"),
    [
        ("{name: L4}", "NVIDIA L40S"),
        ("{name: A10}", "NVIDIA A100-SXM4-40GB"),
        ("{name: A10}", "NVIDIA A10G"),
        ("{name: A100-80GB}", "NVIDIA A100-SXM4-40GB"),
    ],
)
def test_a_runner_reporting_another_model_is_not_given_the_job(
    team: Workspace, owner: Person, gpu: str, reported: str
) -> None:
    _idle(team, "local-gpu", [(reported, 40 * GIB)])

    job = submit(team, owner.user, workflow="gpu", text=workflows(gpu), no_cache=True).jobs.get()

    assert (job.status, job.instance_id) == (JobStatus.PENDING, None)


@pytest.mark.parametrize(
    ("gpu", "reported", "memory_gib"),
    [
        ("{name: L4}", "NVIDIA L4", 24),
        ("{name: l4}", "NVIDIA L4", 24),
        ("{name: T4}", "Tesla T4", 16),
        ("{name: A100}", "NVIDIA A100-SXM4-40GB", 40),  # the alias: each of its models
        ("{name: A100}", "NVIDIA A100 80GB PCIe", 80),
        ("{name: A100-80GB}", "NVIDIA A100-SXM4-80GB", 80),
        ("L4:2", "NVIDIA L4", 24),  # NAME:COUNT in a workflow file
    ],
)
def test_a_runner_reporting_the_model_asked_for_is_given_the_job(
    team: Workspace, owner: Person, gpu: str, reported: str, memory_gib: int
) -> None:
    instance = _idle(team, "local-gpu", [(reported, memory_gib * GIB)] * 2)

    job = submit(team, owner.user, workflow="gpu", text=workflows(gpu), no_cache=True).jobs.get()

    assert (job.status, job.instance_id) == (JobStatus.ASSIGNED, instance.pk)

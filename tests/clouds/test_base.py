"""The contract's helpers: ``shortfall`` (resources), ``in_placement`` (where
and how), and the errors' code, scope and retry-after."""

from __future__ import annotations

import pickle

import pytest

from backend.clouds.backends.base import Gpu, Offer, Requirements, in_placement, shortfall
from backend.clouds.backends.errors import (
    AuthFailed,
    ComputeError,
    InvalidConfig,
    NoCapacity,
    NotYetTerminated,
    QuotaExceeded,
    Scope,
    Transient,
)

GIB = 2**30
A100 = Gpu(name="NVIDIA A100-SXM4-40GB", memory_bytes=40 * GIB)
BOX = Offer(
    backend="fake",
    instance_type="box",
    region="r1",
    zone="r1a",
    cpus=8,
    memory_bytes=32 * GIB,
    disk_bytes=100 * GIB,
    gpus=(A100, A100),
    price_per_hour=1.5,
)


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (Requirements(cpu=16), "16 CPUs requested, 8 available"),
        (Requirements(memory_bytes=64 * GIB), "64.0 GiB memory requested, 32.0 GiB available"),
        (Requirements(disk_bytes=200 * GIB), "200.0 GiB disk requested, 100.0 GiB available"),
        (Requirements(shm_size_bytes=48 * GIB), "48.0 GiB shared memory requested, 32.0 GiB memory available"),
        (
            Requirements(gpu_count=1, gpu_name="V100"),
            "1× V100 requested, this machine has NVIDIA A100-SXM4-40GB, NVIDIA A100-SXM4-40GB",
        ),
        (
            Requirements(gpu_count=4),
            "4× GPU requested, this machine has NVIDIA A100-SXM4-40GB, NVIDIA A100-SXM4-40GB",
        ),
        (
            Requirements(gpu_count=1, gpu_name="A100", gpu_memory_bytes=80 * GIB),
            "1× A100 with 80.0 GiB each requested, the largest has 40.0 GiB",
        ),
    ],
)
def test_shortfall_names_the_first_missing_resource(req: Requirements, message: str) -> None:
    assert shortfall(req, BOX) == message


@pytest.mark.parametrize(
    "req",
    [
        Requirements(),
        Requirements(cpu=8, memory_bytes=32 * GIB, disk_bytes=100 * GIB, shm_size_bytes=32 * GIB),
        Requirements(gpu_count=2, gpu_name="a100", gpu_memory_bytes=40 * GIB),
    ],
)
def test_shortfall_is_none_when_the_offer_covers_everything(req: Requirements) -> None:
    assert shortfall(req, BOX) is None


def test_a_machine_without_gpus_says_so() -> None:
    cpu_only = Offer(backend="fake", instance_type="c", region="r1", cpus=2, memory_bytes=GIB, disk_bytes=GIB)

    assert shortfall(Requirements(gpu_count=1), cpu_only) == "1× GPU requested, this machine has no GPUs"


@pytest.mark.parametrize(
    ("req", "spot", "placed"),
    [
        (Requirements(), False, True),
        (Requirements(), True, False),  # on-demand is the default policy
        (Requirements(spot_policy="spot"), True, True),
        (Requirements(spot_policy="spot"), False, False),
        (Requirements(spot_policy="auto"), True, True),
        (Requirements(spot_policy="auto"), False, True),
        (Requirements(regions=("r1", "r2")), False, True),
        (Requirements(regions=("r2",)), False, False),
        (Requirements(max_price=1.5), False, True),
        (Requirements(max_price=1.49), False, False),
    ],
)
def test_in_placement_reads_regions_spot_policy_and_max_price(req: Requirements, spot: bool, placed: bool) -> None:
    offer = Offer(
        backend="fake", instance_type="box", region="r1", cpus=1, memory_bytes=0, disk_bytes=0, spot=spot,
        price_per_hour=1.5,
    )  # fmt: skip

    assert in_placement(req, offer) is placed


def test_offer_ids_are_stable_and_name_the_market() -> None:
    assert BOX.offer_id == "fake/r1/r1a/box/on-demand"
    assert Offer(
        backend="local", instance_type="host", region="local", cpus=1, memory_bytes=0, disk_bytes=0
    ).offer_id == ("local/local/-/host/on-demand")


@pytest.mark.parametrize(
    ("error", "scope", "retry_after"),
    [
        (NoCapacity, Scope.OFFER, 180.0),
        (QuotaExceeded, Scope.QUOTA, 600.0),
        (Transient, Scope.OFFER, 5.0),
        (AuthFailed, Scope.ACCOUNT, None),
        (InvalidConfig, Scope.ACCOUNT, None),
        (NotYetTerminated, Scope.OFFER, 5.0),
    ],
)
def test_errors_default_their_scope_and_retry_after(
    error: type[ComputeError], scope: Scope, retry_after: float | None
) -> None:
    raised = error("it failed")

    assert (raised.code, raised.scope, raised.retry_after, str(raised)) == (
        error.__name__,
        scope,
        retry_after,
        "it failed",
    )


def test_an_error_keeps_the_clouds_code_scope_and_retry_after_across_pickling() -> None:
    raised = QuotaExceeded("raise the G quota", code="VcpuLimitExceeded", scope=Scope.REGION, retry_after=30)

    copy = pickle.loads(pickle.dumps(raised))

    assert type(copy) is QuotaExceeded
    assert (copy.message, copy.code, copy.scope, copy.retry_after) == (
        "raise the G quota",
        "VcpuLimitExceeded",
        "region",
        30,
    )
    assert str(copy) == "VcpuLimitExceeded: raise the G quota"

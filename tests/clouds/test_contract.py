"""The contract every backend keeps (docs/BACKENDS.md), run on every backend
in ``conftest.SUBJECTS`` with real processes and real files."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from backend.clouds.backends.base import GONE, CloudState, Compute, Handle, Offer, Requirements, shortfall
from backend.clouds.backends.errors import NoCapacity, NotYetTerminated
from tests.clouds.subjects import GIB, SHAPES, Subject, states, terminate_fully, wait_for


def test_launch_is_idempotent_on_its_key(subject: Subject) -> None:
    compute = subject.build()
    spec = subject.spec()

    first = compute.launch(_offer(compute), spec)
    second = compute.launch(_offer(compute), spec)

    assert first.backend_id
    assert second == first
    assert subject.machines_for(spec.idempotency_key) == 1
    terminate_fully(compute, first)


def test_another_backend_object_on_the_same_account_finds_the_first_machine(subject: Subject) -> None:
    # The services build a backend per call, in whichever worker runs the task.
    spec = subject.spec()
    one = subject.build()
    first = one.launch(_offer(one), spec)

    again = subject.build()
    second = again.launch(_offer(again), spec)

    assert second.backend_id == first.backend_id
    assert subject.machines_for(spec.idempotency_key) == 1
    terminate_fully(again, second)


def test_concurrent_launches_of_one_key_start_one_machine(subject: Subject) -> None:
    spec = subject.spec()
    computes = [subject.build() for _ in range(4)]

    with ThreadPoolExecutor(max_workers=4) as pool:
        handles = list(pool.map(lambda c: c.launch(_offer(c), spec), computes))

    assert len({h.backend_id for h in handles}) == 1
    assert subject.machines_for(spec.idempotency_key) == 1
    terminate_fully(computes[0], handles[0])


def test_describe_reports_each_machine_in_one_call(subject: Subject) -> None:
    compute = subject.build()
    launched = compute.launch(_offer(compute), subject.spec())
    never = Handle(key="ty-never-launched")

    wait_for(lambda: states(compute, launched) == [CloudState.RUNNING], what="running")
    assert states(compute, launched, never) == [CloudState.RUNNING, CloudState.NOT_FOUND]

    terminate_fully(compute, launched)
    [after] = states(compute, launched)
    assert after in (CloudState.TERMINATED, CloudState.NOT_FOUND)


def test_a_new_machine_is_pending_or_running(subject: Subject) -> None:
    compute = subject.build()
    launched = compute.launch(_offer(compute), subject.spec())

    assert states(compute, launched)[0] in (CloudState.PENDING, CloudState.RUNNING)
    terminate_fully(compute, launched)


def test_terminate_is_idempotent(subject: Subject) -> None:
    compute = subject.build()
    spec = subject.spec()
    launched = compute.launch(_offer(compute), spec)

    terminate_fully(compute, launched)
    compute.terminate(launched)  # again: already gone is success
    compute.terminate(Handle(key="ty-never-launched"))  # never launched: success

    assert states(compute, launched)[0] in GONE
    assert subject.machines_for(spec.idempotency_key) == 0
    assert compute.list_managed() == []


def test_describe_says_stopping_while_terminate_is_not_done(subject: Subject) -> None:
    compute = subject.build(**subject.slow_to_stop_config())
    spec = subject.spec()
    launched = compute.launch(_offer(compute), spec)
    subject.settle(launched)

    with pytest.raises(NotYetTerminated) as first:
        compute.terminate(launched)

    assert first.value.retry_after is not None and first.value.retry_after > 0
    assert states(compute, launched) == [CloudState.STOPPING]
    assert subject.machines_for(spec.idempotency_key) == 1
    seen: list[CloudState] = []
    terminate_fully(compute, launched, on_not_yet=lambda: seen.extend(states(compute, launched)))
    assert set(seen) <= {CloudState.STOPPING}
    assert states(compute, launched)[0] in GONE
    assert subject.machines_for(spec.idempotency_key) == 0


def test_list_managed_sees_what_was_launched_and_nothing_else(subject: Subject) -> None:
    ours = subject.build()
    theirs = subject.build(installation="ty-another-installation")  # same directory, same host
    a = ours.launch(_offer(ours), subject.spec())
    b = ours.launch(_offer(ours), subject.spec())
    c = theirs.launch(_offer(theirs), subject.spec())

    assert _by_key(ours.list_managed()) == {a.key: a.backend_id, b.key: b.backend_id}
    assert _by_key(theirs.list_managed()) == {c.key: c.backend_id}

    terminate_fully(ours, a)
    assert _by_key(ours.list_managed()) == {b.key: b.backend_id}

    terminate_fully(ours, b)
    terminate_fully(theirs, c)
    assert (ours.list_managed(), theirs.list_managed()) == ([], [])


def test_list_managed_sees_only_its_own_accounts_machines(subject: Subject) -> None:
    """Two accounts of one installation on the same cloud (two workspaces on
    the local host; two connections to one AWS account): the leak sweep of
    one compares what it lists with its own rows only, so it must never see
    the other's machines."""
    mine = subject.build(account_id="acct-1")
    other = subject.build(account_id="acct-2")
    a = mine.launch(_offer(mine), subject.spec())
    b = other.launch(_offer(other), subject.spec())

    assert _by_key(mine.list_managed()) == {a.key: a.backend_id}
    assert _by_key(other.list_managed()) == {b.key: b.backend_id}

    terminate_fully(mine, a)
    terminate_fully(other, b)


def test_offers_are_the_catalog_with_stable_ids(subject: Subject) -> None:
    compute = subject.build(**subject.catalog_config(SHAPES))

    offers = list(compute.offers(Requirements()))

    assert sorted(o.instance_type for o in offers) == ["cpu-big", "cpu-small", "gpu-a100"]
    assert {o.backend for o in offers} == {subject.kind}
    assert [o.offer_id for o in compute.offers(Requirements())] == [o.offer_id for o in offers]
    gpu = next(o for o in offers if o.instance_type == "gpu-a100")
    assert (gpu.cpus, gpu.memory_bytes, gpu.disk_bytes, len(gpu.gpus)) == (16, 64 * GIB, 200 * GIB, 2)


@pytest.mark.parametrize(
    ("req", "fitting"),
    [
        (Requirements(), ["cpu-big", "cpu-small", "gpu-a100"]),
        (Requirements(cpu=4), ["cpu-big", "gpu-a100"]),
        (Requirements(cpu=17), ["cpu-big"]),
        (Requirements(memory_bytes=100 * GIB), ["cpu-big"]),
        (Requirements(disk_bytes=300 * GIB), ["cpu-big"]),
        (Requirements(shm_size_bytes=8 * GIB), ["cpu-big", "gpu-a100"]),
        (Requirements(gpu_count=1), ["gpu-a100"]),
        (Requirements(gpu_count=2, gpu_name="a100"), ["gpu-a100"]),
        (Requirements(gpu_count=3, gpu_name="A100"), []),
        (Requirements(gpu_count=1, gpu_name="V100"), []),
        (Requirements(gpu_count=2, gpu_memory_bytes=40 * GIB), ["gpu-a100"]),
        (Requirements(gpu_count=1, gpu_memory_bytes=80 * GIB), []),
    ],
)
def test_shortfall_keeps_exactly_the_offers_that_fit(subject: Subject, req: Requirements, fitting: list[str]) -> None:
    compute = subject.build(**subject.catalog_config(SHAPES))

    assert sorted(o.instance_type for o in compute.offers(req) if shortfall(req, o) is None) == fitting


def test_a_shortfall_names_what_is_missing(subject: Subject) -> None:
    compute = subject.build(**subject.catalog_config(SHAPES))
    small = next(o for o in compute.offers(Requirements()) if o.instance_type == "cpu-small")

    assert shortfall(Requirements(gpu_count=1, gpu_name="A100"), small) == "1× A100 requested, this machine has no GPUs"
    assert shortfall(Requirements(disk_bytes=30 * GIB), small) == "30.0 GiB disk requested, 20.0 GiB available"


def test_an_offer_the_catalog_does_not_have_is_no_capacity(subject: Subject) -> None:
    compute = subject.build(**subject.catalog_config(SHAPES))
    spec = subject.spec()
    unknown = dataclasses.replace(_offer(compute), instance_type="no-such-type")

    with pytest.raises(NoCapacity):
        compute.launch(unknown, spec)

    assert subject.machines_for(spec.idempotency_key) == 0
    assert compute.list_managed() == []


def _offer(compute: Compute) -> Offer:
    return min(compute.offers(Requirements()), key=lambda o: (o.price_per_hour, o.cpus))


def _by_key(handles: Sequence[Handle]) -> dict[str, str]:
    return {h.key: h.backend_id for h in handles}

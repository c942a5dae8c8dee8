"""The fake backend's script: each way a cloud misbehaves, on demand, while
the system runs; and its state shared across processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.clouds.backends.base import AccountConfig, CloudState, Compute, Handle, Offer, Requirements
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
from backend.clouds.backends.fake.compute import FakeCompute
from backend.clouds.backends.fake.script import write_script
from backend.clouds.backends.fake.state import read_calls, read_machines
from tests.clouds.subjects import (
    FakeSubject,
    FakeWithRunnerSubject,
    runner_pids,
    runner_roots,
    states,
    terminate_fully,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeSubject]:
    made = FakeSubject(name="fake", root=tmp_path)
    yield made
    left = made.leftovers()
    assert left == [], f"the test left these running: {left}"


@pytest.fixture
def fake_runner(tmp_path: Path) -> Iterator[FakeWithRunnerSubject]:
    made = FakeWithRunnerSubject(name="fake-runner", root=tmp_path)
    yield made
    left = made.leftovers()
    assert left == [], f"the test left these running: {left}"


def test_the_default_catalog_is_three_cheap_cpu_machines(fake: FakeSubject) -> None:
    offers = list(fake.build().offers(Requirements()))

    assert [(o.instance_type, o.cpus, o.price_per_hour, o.gpus, o.spot) for o in offers] == [
        ("fake-small", 2, 0.05, (), False),
        ("fake-medium", 4, 0.1, (), False),
        ("fake-large", 8, 0.2, (), False),
    ]
    assert offers[0].offer_id == "fake/fake-region-1/fake-region-1a/fake-small/on-demand"


def test_no_capacity_for_the_first_launches_then_a_machine(fake: FakeSubject) -> None:
    write_script(fake.script, {"no_capacity_first": 2})
    compute = fake.build()
    offer = _offer(compute, "fake-small")

    for _ in range(2):
        with pytest.raises(NoCapacity) as raised:
            compute.launch(offer, fake.spec())
        assert (raised.value.code, raised.value.scope) == ("FakeNoCapacity", Scope.OFFER)
    handle = compute.launch(offer, fake.spec())

    assert [(c["call"], c["result"]) for c in read_calls(fake.state_dir)] == [
        ("launch", "NoCapacity"),
        ("launch", "NoCapacity"),
        ("launch", "created"),
    ]
    # Counted in the state dir: another backend object (another worker) continues the count.
    assert fake.build().launch(offer, fake.spec()).backend_id != handle.backend_id
    for h in fake.build().list_managed():
        terminate_fully(compute, h)


def test_no_capacity_by_instance_type_or_offer_id(fake: FakeSubject) -> None:
    compute = fake.build()
    small, medium, large = (_offer(compute, t) for t in ("fake-small", "fake-medium", "fake-large"))
    write_script(fake.script, {"no_capacity": ["fake-small", medium.offer_id]})

    for refused in (small, medium):
        with pytest.raises(NoCapacity):
            compute.launch(refused, fake.spec())
    handle = compute.launch(large, fake.spec())

    assert [m.instance_type for m in read_machines(fake.state_dir)] == ["fake-large"]
    terminate_fully(compute, handle)


@pytest.mark.parametrize(
    ("kind", "error", "scope"),
    [
        ("quota", QuotaExceeded, Scope.QUOTA),
        ("auth", AuthFailed, Scope.ACCOUNT),
        ("invalid", InvalidConfig, Scope.ACCOUNT),
        ("transient", Transient, Scope.OFFER),
        ("no_capacity", NoCapacity, Scope.OFFER),
    ],
)
def test_a_scripted_launch_error_is_raised_with_its_code_and_message(
    fake: FakeSubject, kind: str, error: type[ComputeError], scope: Scope
) -> None:
    write_script(fake.script, {"launch_error": {"kind": kind, "code": "SomeCode", "message": "what to do"}})
    compute = fake.build()

    with pytest.raises(error) as raised:
        compute.launch(_offer(compute, "fake-small"), fake.spec())

    assert (type(raised.value), raised.value.code, raised.value.message, raised.value.scope) == (
        error,
        "SomeCode",
        "what to do",
        scope,
    )
    assert read_machines(fake.state_dir) == []
    assert read_calls(fake.state_dir)[-1]["code"] == "SomeCode"


def test_the_script_is_read_again_on_every_call(fake: FakeSubject) -> None:
    compute = fake.build()
    offer = _offer(compute, "fake-small")
    write_script(fake.script, {"launch_error": {"kind": "transient", "message": "throttled"}})
    with pytest.raises(Transient):
        compute.launch(offer, fake.spec())

    write_script(fake.script, {})
    handle = compute.launch(offer, fake.spec())

    assert states(compute, handle) == [CloudState.RUNNING]
    terminate_fully(compute, handle)


def test_terminate_delay_keeps_the_machine_stopping_for_that_long(fake: FakeSubject) -> None:
    write_script(fake.script, {"terminate_delay": 0.5})
    compute = fake.build()
    handle = compute.launch(_offer(compute, "fake-small"), fake.spec())
    started = time.monotonic()

    not_yet = terminate_fully(compute, handle)

    assert time.monotonic() - started >= 0.5
    assert not_yet >= 1
    assert states(compute, handle) == [CloudState.TERMINATED]
    assert [c["result"] for c in read_calls(fake.state_dir) if c["call"] == "terminate"][-1] == "terminated"


def test_an_interruption_at_a_time_reclaims_the_machine_and_kills_its_runner(
    fake_runner: FakeWithRunnerSubject,
) -> None:
    compute = fake_runner.build()
    doomed = compute.launch(_offer(compute, "fake-small"), fake_runner.spec())
    spared = compute.launch(_offer(compute, "fake-small"), fake_runner.spec())
    write_script(fake_runner.script, {"interrupt": {doomed.key: time.time() + 0.5}})
    assert states(compute, doomed, spared) == [CloudState.RUNNING, CloudState.RUNNING]

    wait_for(lambda: states(compute, doomed)[0] == CloudState.INTERRUPTED, what="the interruption")

    assert states(compute, spared) == [CloudState.RUNNING]
    assert runner_pids(fake_runner.runners_dir, doomed.key) == []  # SIGKILLed, as a reclaimed machine dies
    assert len(runner_roots(fake_runner.runners_dir, spared.key)) == 1
    assert [h.key for h in compute.list_managed()] == [spared.key]
    write_script(fake_runner.script, {})  # from then on: the script changing does not bring it back
    assert states(compute, doomed) == [CloudState.INTERRUPTED]
    terminate_fully(compute, doomed)
    terminate_fully(compute, spared)


def test_an_interruption_of_every_machine_spares_the_ones_launched_later(fake: FakeSubject) -> None:
    compute = fake.build()
    before = compute.launch(_offer(compute, "fake-small"), fake.spec())
    write_script(fake.script, {"interrupt": {"*": time.time()}})
    time.sleep(0.01)

    after = compute.launch(_offer(compute, "fake-small"), fake.spec())

    assert states(compute, before, after) == [CloudState.INTERRUPTED, CloudState.RUNNING]
    terminate_fully(compute, before)
    terminate_fully(compute, after)


def test_a_vanished_machine_is_not_found_and_its_runner_is_gone(fake_runner: FakeWithRunnerSubject) -> None:
    compute = fake_runner.build()
    handle = compute.launch(_offer(compute, "fake-medium"), fake_runner.spec())
    write_script(fake_runner.script, {"vanish": [handle.data["instance_name"]]})

    assert states(compute, handle) == [CloudState.NOT_FOUND]
    wait_for(lambda: runner_pids(fake_runner.runners_dir) == [], what="the vanished machine's runner to die")
    assert compute.list_managed() == []
    compute.terminate(handle)  # not found is success


def test_a_booting_machine_is_pending_then_running(fake: FakeSubject) -> None:
    compute = fake.build(boot_seconds=0.5)
    handle = compute.launch(_offer(compute, "fake-small"), fake.spec())

    assert states(compute, handle) == [CloudState.PENDING]
    wait_for(lambda: states(compute, handle) == [CloudState.RUNNING], what="the boot")
    terminate_fully(compute, handle)


def test_a_machine_with_a_runner_reports_the_offers_resources(fake_runner: FakeWithRunnerSubject) -> None:
    compute = fake_runner.build()
    offer = _offer(compute, "fake-large")

    handle = compute.launch(offer, fake_runner.spec())

    [pid] = runner_pids(fake_runner.runners_dir, handle.key)
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    declared = next(v for v in environ if v.startswith(b"TRAINYARD_RUNNER_RESOURCES=")).split(b"=", 1)[1]
    assert json.loads(declared) == {"cpus": 8, "memory_bytes": 32 * 2**30, "disk_bytes": 200 * 2**30, "gpus": []}
    terminate_fully(compute, handle)


def test_a_key_launched_again_after_its_machine_was_reclaimed_gets_a_new_machine(fake: FakeSubject) -> None:
    compute = fake.build()
    spec = fake.spec()
    first = compute.launch(_offer(compute, "fake-small"), spec)
    write_script(fake.script, {"interrupt": {spec.idempotency_key: time.time()}})
    assert states(compute, first) == [CloudState.INTERRUPTED]
    write_script(fake.script, {})

    second = compute.launch(_offer(compute, "fake-small"), spec)

    assert second.backend_id != first.backend_id
    assert states(compute, second) == [CloudState.RUNNING]
    terminate_fully(compute, second)


def test_another_process_sees_the_same_machines(fake: FakeSubject) -> None:
    compute = fake.build()
    spec = fake.spec()
    handle = compute.launch(_offer(compute, "fake-small"), spec)
    config = {**fake.config(), "installation": "ty-test", "key": spec.idempotency_key}

    other = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS, json.dumps(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    assert json.loads(other.stdout) == {"backend_id": handle.backend_id, "managed": [spec.idempotency_key]}
    assert [c["result"] for c in read_calls(fake.state_dir)] == ["created", "found"]
    terminate_fully(compute, handle)


OTHER_PROCESS = """
import json, sys
from backend.clouds.backends.base import AccountConfig, LaunchSpec, Requirements
from backend.clouds.backends.registry import compute_for
config = json.loads(sys.argv[1])
account = AccountConfig(account_id="acct-1", workspace_id="ws-1", kind="fake", installation=config.pop("installation"),
                        config={"state_dir": config["state_dir"], "script_file": config["script_file"]})
compute = compute_for(account)
offer = next(o for o in compute.offers(Requirements()) if o.instance_type == "fake-small")
spec = LaunchSpec(idempotency_key=config["key"], instance_name="x", runner_token="t", server_url="http://127.0.0.1:9")
print(json.dumps({"backend_id": compute.launch(offer, spec).backend_id,
                  "managed": [h.key for h in compute.list_managed()]}))
"""


def test_list_managed_is_per_account_too(fake: FakeSubject) -> None:
    ours = fake.build()
    handle = ours.launch(_offer(ours, "fake-small"), fake.spec())
    other_account = FakeCompute(
        AccountConfig(
            account_id="acct-2", workspace_id="ws-2", kind="fake", installation="ty-test", config=fake.config()
        )
    )

    assert (len(ours.list_managed()), other_account.list_managed()) == (1, [])
    terminate_fully(ours, handle)


def test_an_invalid_script_is_invalid_config_naming_the_file(fake: FakeSubject) -> None:
    fake.script.write_text('{"no_capacity_first": "two"}')
    compute = fake.build()

    with pytest.raises(InvalidConfig) as raised:
        compute.launch(_offer(compute, "fake-small"), fake.spec())

    assert raised.value.message == (
        f"the fake backend's script {fake.script} is invalid: no_capacity_first must be a number ≥ 0"
    )
    write_script(fake.script, {})


def test_a_script_key_the_fake_does_not_know_is_refused(fake: FakeSubject) -> None:
    write_script(fake.script, {"no_capacity_forever": True})

    with pytest.raises(InvalidConfig) as raised:
        fake.build().describe([Handle(key="ty-x")])

    assert raised.value.message.endswith(
        "must be an object with keys among ['describe_delay', 'interrupt', 'launch_delay', 'launch_error', 'no_capacity',"
        " 'no_capacity_first', 'terminate_delay', 'vanish']"
    )
    write_script(fake.script, {})


def test_terminate_of_a_stopping_machine_is_not_yet_until_the_delay_is_over(fake: FakeSubject) -> None:
    write_script(fake.script, {"terminate_delay": 30})
    compute = fake.build()
    handle = compute.launch(_offer(compute, "fake-small"), fake.spec())

    for _ in range(2):
        with pytest.raises(NotYetTerminated):
            compute.terminate(handle)

    assert states(compute, handle) == [CloudState.STOPPING]
    assert [h.key for h in compute.list_managed()] == [handle.key]  # still a machine: the leak sweep sees it
    write_script(fake.script, {})
    terminate_fully(compute, handle)


def _offer(compute: Compute, instance_type: str) -> Offer:
    return next(o for o in compute.offers(Requirements(spot_policy="auto")) if o.instance_type == instance_type)

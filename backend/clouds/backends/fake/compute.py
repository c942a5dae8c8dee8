"""The ``fake`` backend: a scriptable cloud for tests.

Its machines are files under ``state_dir`` (``state.py``), shared by every
process that builds a ``FakeCompute`` on that directory; how it fails is a
script file re-read on every call (``script.py``). With ``run_runner`` on,
each machine also gets a real ``trainyard-runner`` process, started exactly
as the ``local`` backend starts one, that reports the offer's resources, so
end-to-end tests can run jobs on fake machines.

Config keys (``AccountConfig.config``):

``state_dir`` (str, required)
    The fake cloud: machines, the calls log, counters, runners.
``offers`` (list of objects; default ``DEFAULT_OFFERS``: fake-small, -medium, -large)
    The catalog: ``{"instance_type", "region", "zone", "spot", "price_per_hour",
    "cpus", "memory_bytes", "disk_bytes", "gpus": [{"name", "memory_bytes"}],
    "quota_family"}``; instance_type and cpus are required, region defaults to
    ``fake-region-1``; ``spot: true`` makes a spot offer (list a type twice for
    both markets); ``quota_family`` is the quota it counts against (``Offer.data``).
``run_runner`` (bool; default false)
    Start a real runner per machine (then ``runner_command``,
    ``env_strip_prefixes`` and ``kill_after`` work as for ``local``).
``jobs_outlive_runner`` (bool; default true)
    The runner's ``--jobs-outlive-runner``: a killed runner leaves its jobs
    running on the machine, and a runner started again with the same token
    and work directory re-attaches to them. Interrupting, vanishing or
    terminating the machine kills them.
``boot_seconds`` (number; default 0)
    A machine is PENDING this long after launch, then RUNNING. (Its runner,
    if any, starts at launch.)
``script_file`` (str; default none)
    The script (``script.py`` lists its keys).

Interruptions and vanishings in the script take effect (state recorded,
runner SIGKILLed) when the backend is next called: any ``launch``,
``describe``, ``terminate`` or ``list_managed`` on the state dir applies
them to every machine, and ``FakeCompute.sync()`` does only that.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from backend.clouds.backends.base import (
    GONE,
    LAUNCHED_AT,
    AccountConfig,
    CloudState,
    Compute,
    Handle,
    LaunchSpec,
    Offer,
    Requirements,
    Timings,
    in_placement,
)
from backend.clouds.backends.config import (
    config_bool,
    config_dicts,
    config_float,
    config_str,
    field_bool,
    field_float,
    field_gpus,
    field_int,
    field_str,
)
from backend.clouds.backends.errors import ComputeError, NoCapacity, NotYetTerminated
from backend.clouds.backends.fake.script import Script, load_script
from backend.clouds.backends.fake.state import FakeState, Machine
from backend.clouds.backends.local.compute import launch_record
from backend.clouds.backends.local.process import RunnerDir, RunnerSettings, offer_resources

GIB = 2**30
REGION = "fake-region-1"
DEFAULT_OFFERS: list[Mapping[str, object]] = [
    {"instance_type": "fake-small", "cpus": 2, "memory_bytes": 4 * GIB, "disk_bytes": 50 * GIB, "price_per_hour": 0.05},
    {
        "instance_type": "fake-medium",
        "cpus": 4,
        "memory_bytes": 16 * GIB,
        "disk_bytes": 100 * GIB,
        "price_per_hour": 0.1,
    },
    {
        "instance_type": "fake-large",
        "cpus": 8,
        "memory_bytes": 32 * GIB,
        "disk_bytes": 200 * GIB,
        "price_per_hour": 0.2,
    },
]


class FakeCompute(Compute):
    kind = "fake"
    reusable_instances = True
    supports_spot = True
    timings = Timings(provision_timeout=60.0)

    def __init__(self, account: AccountConfig) -> None:
        super().__init__(account)
        state_dir = Path(config_str(account, "state_dir"))
        self.state = FakeState(state_dir)
        # A fake machine survives its runner, as a cloud VM does: its jobs outlive the runner too.
        self.runners = RunnerDir(state_dir / "runners", RunnerSettings.from_config(account, jobs_outlive_runner=True))
        self.run_runner = config_bool(account, "run_runner", False)
        self.boot_seconds = config_float(account, "boot_seconds", 0.0)
        script_file = account.config.get("script_file")
        self.script_file = Path(config_str(account, "script_file")) if script_file is not None else None
        self.catalog = _catalog(account, kind=self.kind)

    def offers(self, req: Requirements) -> Iterable[Offer]:
        return [offer for offer in self.catalog if in_placement(req, offer)]

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        """1. A live machine of the key (not terminated, interrupted or
        vanished) is returned as it is.
        2. Else the script may refuse: ``no_capacity_first``, ``no_capacity``,
        ``launch_error``; an offer not in the catalog is NoCapacity.
        3. Else a new machine (and, with ``run_runner``, its runner).
        Every call is logged with its result."""
        key, script, now = spec.idempotency_key, self._script(), time.time()
        with self.state.locked():
            self._sync(script, now)
            existing = self.state.machine(key)
            if existing is not None and self._state(existing, now) not in GONE:
                self.state.log_call("launch", key, "found", offer_id=offer.offer_id)
                return _handle(existing)
            try:
                machine = self._create(offer, spec, script, now)
            except ComputeError as exc:
                self.state.log_call("launch", key, type(exc).__name__, offer_id=offer.offer_id, code=exc.code)
                raise
            self.state.log_call("launch", key, "created", offer_id=offer.offer_id)
        if script.launch_delay:
            time.sleep(script.launch_delay)  # outside the lock: other calls go on meanwhile
        return _handle(machine)

    def describe(self, handles: Sequence[Handle]) -> Mapping[str, CloudState]:
        self._slow()
        now = time.time()
        with self.state.locked():
            self._sync(self._script(), now)
            return {handle.key: self._state(self.state.machine(handle.key), now) for handle in handles}

    def _slow(self) -> None:
        delay = self._script().describe_delay
        if delay:
            time.sleep(delay)  # outside the lock: other calls go on meanwhile

    def terminate(self, handle: Handle) -> None:
        """NotYetTerminated for ``terminate_delay`` seconds after the first
        call, and while the machine's runner is still shutting down."""
        key, script, now = handle.key, self._script(), time.time()
        with self.state.locked():
            self._sync(script, now)
            try:
                self._terminate(self.state.machine(key), script, now)
            except NotYetTerminated:
                self.state.log_call("terminate", key, "NotYetTerminated")
                raise
            self.state.log_call("terminate", key, "terminated")

    def list_managed(self) -> Sequence[Handle]:
        """Live machines of this installation and this account (two fake
        accounts on one state dir are two clouds' accounts)."""
        self._slow()
        now = time.time()
        with self.state.locked():
            self._sync(self._script(), now)
            return [
                _handle(machine)
                for machine in self.state.machines()
                if machine.installation == self.account.installation
                and machine.account_id == self.account.account_id
                and self._state(machine, now) not in GONE
            ]

    def sync(self) -> None:
        """Apply the script's interruptions and vanishings now."""
        with self.state.locked():
            self._sync(self._script(), time.time())

    def _create(self, offer: Offer, spec: LaunchSpec, script: Script, now: float) -> Machine:
        if self.state.bump("launches") <= script.no_capacity_first:
            raise NoCapacity(f"no capacity for {offer.instance_type} (no_capacity_first)", code="FakeNoCapacity")
        if offer.offer_id in script.no_capacity or offer.instance_type in script.no_capacity:
            raise NoCapacity(f"no capacity for {offer.offer_id}", code="FakeNoCapacity")
        if script.launch_error is not None and _matches(offer, script.launch_error_only):
            raise script.launch_error
        known = {known.offer_id: known for known in self.catalog}
        if offer.offer_id not in known:
            raise NoCapacity(f"the fake backend has no offer {offer.offer_id}", code="UnknownOffer")
        offer = known[offer.offer_id]  # the catalog's resources, whatever the caller kept
        machine = _machine(self.account, offer, spec, now, runner=self.run_runner)
        self.state.save(machine)
        if self.run_runner:
            try:
                self.runners.start(
                    spec, record=launch_record(self.account, offer, spec), resources=offer_resources(offer)
                )
            except ComputeError:
                self.state.delete(machine.key)
                raise
        return machine

    def _terminate(self, machine: Machine | None, script: Script, now: float) -> None:
        if machine is None or machine.terminated_at is not None or machine.vanished_at is not None:
            self._stop_runner(machine)
            return
        requested = machine.terminate_requested_at
        if requested is None:
            requested = now
            machine = replace(machine, terminate_requested_at=now)
            self.state.save(machine)
        if now - requested < script.terminate_delay:
            raise NotYetTerminated(f"{machine.instance_name} is shutting down (terminate_delay)", retry_after=1.0)
        self._stop_runner(machine)
        self.state.save(replace(machine, terminated_at=now))

    def _stop_runner(self, machine: Machine | None) -> None:
        if machine is not None and machine.runner and not self.runners.stop(machine.key):
            raise NotYetTerminated(f"the runner of {machine.instance_name} is still shutting down", retry_after=1.0)

    def _sync(self, script: Script, now: float) -> None:
        """Record the script's interruptions and vanishings; kill those runners."""
        for machine in self.state.machines():
            changed = _scripted(machine, script, now)
            if changed is not machine:
                self.state.save(changed)
                if machine.runner:
                    self.runners.kill(machine.key)

    def _state(self, machine: Machine | None, now: float) -> CloudState:
        if machine is None:
            return CloudState.NOT_FOUND
        return machine.state(now=now, boot_seconds=self.boot_seconds)

    def _script(self) -> Script:
        return load_script(self.script_file)


def _matches(offer: Offer, names: frozenset[str]) -> bool:
    """True when ``names`` is empty or names the offer, its type, zone or quota family."""
    ours = {offer.offer_id, offer.instance_type, offer.zone, offer.data.get("quota_family", "")}
    return not names or bool(names & ours)


def _scripted(machine: Machine, script: Script, now: float) -> Machine:
    """``machine`` with what the script did to it by ``now`` (the same object when nothing)."""
    if machine.terminated_at is not None or machine.vanished_at is not None:
        return machine
    if machine.named(script.vanish):
        return replace(machine, vanished_at=now)
    if machine.interrupted_at is None:
        at = _interrupt_time(machine, script)
        if at is not None and at <= now:
            return replace(machine, interrupted_at=at)
    return machine


def _interrupt_time(machine: Machine, script: Script) -> float | None:
    for name in (machine.key, machine.instance_name):
        if name in script.interrupt:
            return script.interrupt[name]
    every = script.interrupt.get("*")
    # "*" reclaims the machines that exist at that time, not their replacements.
    return every if every is not None and machine.launched_at <= every else None


def _machine(account: AccountConfig, offer: Offer, spec: LaunchSpec, now: float, *, runner: bool) -> Machine:
    return Machine(
        key=spec.idempotency_key,
        backend_id=f"fake-{secrets.token_hex(8)}",
        instance_name=spec.instance_name,
        installation=account.installation,
        account_id=account.account_id,
        workspace_id=account.workspace_id,
        offer_id=offer.offer_id,
        instance_type=offer.instance_type,
        region=offer.region,
        zone=offer.zone,
        spot=offer.spot,
        price_per_hour=offer.price_per_hour,
        launched_at=now,
        runner=runner,
        tags=dict(spec.tags),
    )


def _handle(machine: Machine) -> Handle:
    return Handle(
        key=machine.key,
        backend_id=machine.backend_id,
        region=machine.region,
        data={
            "instance_name": machine.instance_name,
            "instance_type": machine.instance_type,
            "zone": machine.zone,
            LAUNCHED_AT: f"{machine.launched_at:.3f}",
        },
    )


def _catalog(account: AccountConfig, *, kind: str) -> tuple[Offer, ...]:
    raw = config_dicts(account, "offers")
    return tuple(_offer(account, item, kind=kind) for item in (DEFAULT_OFFERS if raw is None else raw))


def _offer(account: AccountConfig, item: Mapping[str, object], *, kind: str) -> Offer:
    region = field_str(account, "offers", item, "region", REGION)
    return Offer(
        backend=kind,
        instance_type=field_str(account, "offers", item, "instance_type"),
        region=region,
        zone=field_str(account, "offers", item, "zone", f"{region}a"),
        spot=field_bool(account, "offers", item, "spot", False),
        price_per_hour=field_float(account, "offers", item, "price_per_hour", 0.0),
        cpus=field_int(account, "offers", item, "cpus"),
        memory_bytes=field_int(account, "offers", item, "memory_bytes", 0),
        disk_bytes=field_int(account, "offers", item, "disk_bytes", 0),
        gpus=field_gpus(account, "offers", item),
        data=_offer_data(account, item),
    )


def _offer_data(account: AccountConfig, item: Mapping[str, object]) -> dict[str, str]:
    family = field_str(account, "offers", item, "quota_family", "")
    return {"quota_family": family} if family else {}

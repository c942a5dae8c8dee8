"""The ``local`` backend: ``trainyard-runner`` processes on the server's own host.

For the embedded default and tests. Each machine is one runner process,
detached in its own session, found again by its files under ``runners_dir``
(``process.py``): launch, describe and terminate work from any process that
sees that directory, and outlive the Celery worker that started a runner.

Config keys (``AccountConfig.config``):

``runners_dir`` (str, required)
    Where the runners' pid, record, log and work directory live; the services
    use ``$TRAINYARD_DATA_DIR/local-runners``, where the embedded supervisor
    looks for leftovers (``backend/embedded/runners.py``).
``runner_command`` (list of str; default ``[sys.executable, "-m", "trainyard_runner"]``)
    The runner's command line. Its process must show ``trainyard_runner`` or
    ``trainyard-runner`` in ``/proc/<pid>/cmdline``: that is how a live
    runner is told from a reused pid.
``shapes`` (list of objects; default: none, one offer for this host)
    Fake machine shapes for tests, one offer each: ``{"name": "gpu-box",
    "cpus": 8, "memory_bytes": …, "disk_bytes": …, "gpus": [{"name": "A100",
    "memory_bytes": …}]}``. A runner launched on a shape reports exactly it in
    its Hello (``TRAINYARD_RUNNER_RESOURCES``).
``env_strip_prefixes`` (list of str; default ``SERVER_ONLY_PREFIXES``)
    Variables of the server's environment whose names start with one of
    these are not passed to runners (nor so to their jobs).
``kill_after`` (number, seconds; default 10)
    ``terminate`` SIGKILLs a runner still alive this long after its SIGTERM.
``jobs_outlive_runner`` (bool; default false)
    The runner's ``--jobs-outlive-runner``. Off: a runner's jobs die with it
    (a dead local runner is a gone machine: its attempt is retried, and
    ``make run``'s Ctrl-C leaves no job behind).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from backend.clouds.backends.base import (
    LAUNCHED_AT,
    AccountConfig,
    CloudState,
    Compute,
    Handle,
    LaunchSpec,
    Offer,
    Requirements,
    Timings,
    VolumeInfo,
    VolumeSpec,
    in_placement,
)
from backend.clouds.backends.config import config_dicts, config_str, field_gpus, field_int, field_str
from backend.clouds.backends.errors import InvalidConfig, NoCapacity, NotYetTerminated
from backend.clouds.backends.local.host import free_disk_bytes, host_cpus, host_gpus, host_memory_bytes
from backend.clouds.backends.local.process import Runner, RunnerDir, RunnerSettings, offer_resources, volumes_dir

REGION = "local"
HOST = "host"  # the instance type of the one offer when no shapes are configured


class LocalCompute(Compute):
    kind = "local"
    reusable_instances = True
    supports_spot = False
    timings = Timings(provision_timeout=60.0)
    # A folder of the host per volume (``volumes_dir``): every local runner of the workspace sees it.
    volume_kind = "directory"

    def __init__(self, account: AccountConfig) -> None:
        super().__init__(account)
        self.runners_dir = Path(config_str(account, "runners_dir"))
        self.runners = RunnerDir(self.runners_dir, RunnerSettings.from_config(account))
        self._shapes = _shapes(account, kind=self.kind)

    def volume_create(self, spec: VolumeSpec) -> VolumeInfo:
        """The folder ``<runners_dir>/volumes/<workspace>/<key>``, which the
        workspace's local runners see as ``<volumes dir>/<key>``."""
        folder = volumes_dir(self.runners_dir, self.account.workspace_id) / spec.key
        folder.mkdir(parents=True, exist_ok=True)
        return VolumeInfo(key=spec.key, backend_id=spec.key, region=REGION)

    def volume_delete(self, volume: VolumeInfo) -> None:
        """The folder and everything in it."""
        if volume.backend_id and "/" not in volume.backend_id and volume.backend_id not in (".", ".."):
            shutil.rmtree(
                volumes_dir(self.runners_dir, self.account.workspace_id) / volume.backend_id, ignore_errors=True
            )

    def offers(self, req: Requirements) -> Iterable[Offer]:
        """The configured shapes, or this host; price 0, on-demand, region "local"."""
        return [offer for offer in self._catalog() if in_placement(req, offer)]

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        """Start a runner; a live runner of ``spec.idempotency_key`` is
        returned instead of starting another. ``NoCapacity`` for an offer that
        is not (or no longer) in the catalog, ``InvalidConfig`` when the
        command cannot be started."""
        resources = self._resources(offer)
        record = launch_record(self.account, offer, spec)
        return runner_handle(self.runners.start(spec, record=record, resources=resources))

    def describe(self, handles: Sequence[Handle]) -> Mapping[str, CloudState]:
        """RUNNING while the runner lives (STOPPING once terminate was asked),
        TERMINATED when its files remain but the process is gone, NOT_FOUND
        when the directory has no file for the key. Never PENDING: a started
        process is up."""
        return {handle.key: runner_state(self.runners.find(handle.key)) for handle in handles}

    def terminate(self, handle: Handle) -> None:
        """SIGTERM, then SIGKILL after ``kill_after``; ``NotYetTerminated``
        while the process lives. An unknown key is success."""
        if not self.runners.stop(handle.key):
            raise NotYetTerminated(f"the runner of {handle.key} is still shutting down", retry_after=1.0)

    def list_managed(self) -> Sequence[Handle]:
        """Live runners in ``runners_dir`` launched by this installation for
        this account: every workspace has its own local account on the same
        host, and the leak sweep of one must never see another's runners."""
        return [
            runner_handle(runner)
            for runner in self.runners.all()
            if runner.pid is not None
            and runner.record.get("installation") == self.account.installation
            and runner.record.get("account_id") == self.account.account_id
        ]

    def _catalog(self) -> list[Offer]:
        if self._shapes is not None:
            return list(self._shapes)
        return [
            Offer(
                backend=self.kind,
                instance_type=HOST,
                region=REGION,
                cpus=host_cpus(),
                memory_bytes=host_memory_bytes(),
                disk_bytes=free_disk_bytes(self.runners_dir),
                gpus=host_gpus(),
            )
        ]

    def _resources(self, offer: Offer) -> dict[str, object] | None:
        """The shape's resources for the runner's Hello; None for the host."""
        if offer.backend == self.kind:
            if self._shapes is None and offer.instance_type == HOST:
                return None
            for shape in self._shapes or ():
                if shape.instance_type == offer.instance_type:
                    return offer_resources(shape)
        known = ", ".join(o.instance_type for o in self._catalog())
        raise NoCapacity(
            f"the local backend has no machine {offer.instance_type!r} (it has: {known})", code="UnknownOffer"
        )


def launch_record(account: AccountConfig, offer: Offer, spec: LaunchSpec) -> dict[str, object]:
    """What a runner's ``<key>.json`` says about it (never the token)."""
    return {
        "installation": account.installation,
        "account_id": account.account_id,
        "workspace_id": account.workspace_id,
        "instance_name": spec.instance_name,
        "offer_id": offer.offer_id,
        "instance_type": offer.instance_type,
        "tags": dict(spec.tags),
    }


def runner_handle(runner: Runner) -> Handle:
    started = runner.record.get("started_at")
    return Handle(
        key=runner.key,
        backend_id=str(runner.pid or ""),
        region=REGION,
        data={
            "instance_name": str(runner.record.get("instance_name", "")),
            "instance_type": str(runner.record.get("instance_type", "")),
            **({LAUNCHED_AT: f"{float(started):.3f}"} if isinstance(started, int | float) else {}),
        },
    )


def runner_state(runner: Runner | None) -> CloudState:
    if runner is None:
        return CloudState.NOT_FOUND
    if runner.pid is None:
        return CloudState.TERMINATED
    return CloudState.STOPPING if runner.stopping else CloudState.RUNNING


def _shapes(account: AccountConfig, *, kind: str) -> tuple[Offer, ...] | None:
    raw = config_dicts(account, "shapes")
    if raw is None:
        return None
    shapes = tuple(
        Offer(
            backend=kind,
            instance_type=field_str(account, "shapes", item, "name"),
            region=REGION,
            cpus=field_int(account, "shapes", item, "cpus"),
            memory_bytes=field_int(account, "shapes", item, "memory_bytes"),
            disk_bytes=field_int(account, "shapes", item, "disk_bytes"),
            gpus=field_gpus(account, "shapes", item),
        )
        for item in raw
    )
    names = [shape.instance_type for shape in shapes]
    if len(set(names)) != len(names) or any(shape.cpus < 1 for shape in shapes):
        raise InvalidConfig(
            f"the {account.kind} backend's shapes need distinct names and at least 1 CPU each: {names}",
            code="BadConfig",
        )
    return shapes

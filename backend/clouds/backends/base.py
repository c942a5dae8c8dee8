"""The contract every compute backend implements (docs/BACKENDS.md).

A backend turns offers into machines that run ``trainyard-runner``. It is
plain Python: no Django model, no database, nothing of ``backend.runs``. The
``clouds`` services call it from Celery tasks, never inside a database
transaction, and every outbound call it makes has a timeout.

Identity: every machine is launched under an *idempotency key* (the Instance
row's key). A backend tags or names the machine with it so that ``launch``
with the same key finds the first machine instead of starting a second one,
and ``list_managed`` can find every machine of this installation, even one
whose row was lost.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Literal

from backend.clouds.backends.errors import InvalidConfig
from backend.clouds.backends.gpus import gpu_matches, gpu_model

SpotPolicy = Literal["spot", "on-demand", "auto"]


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int = 0

    def to_data(self) -> dict[str, Any]:
        """As JSON: in an offer's row, a runner's resources, the API."""
        return {"name": self.name, "memory_bytes": self.memory_bytes}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Gpu:
        return cls(str(data.get("name", "")), int(data.get("memory_bytes", 0) or 0))

    @property
    def model(self) -> str:
        """The exact model (``gpus.gpu_model``): ``L40S`` for ``NVIDIA L40S``,
        ``A100-40GB`` for a catalog's ``A100`` of 40 GiB."""
        return gpu_model(self.name, self.memory_bytes)


@dataclass(frozen=True)
class Requirements:
    """What a job needs. ``None`` / 0 / "" means "no requirement"."""

    cpu: int | None = None
    memory_bytes: int | None = None
    disk_bytes: int | None = None
    shm_size_bytes: int | None = None
    gpu_count: int = 0
    gpu_name: str = ""
    gpu_memory_bytes: int | None = None
    spot_policy: SpotPolicy = "on-demand"
    regions: tuple[str, ...] = ()
    max_price: float | None = None


@dataclass(frozen=True)
class Offer:
    """One way to get a machine: a type in a region (and zone), spot or not,
    at a price. ``offer_id`` is stable across calls (the same shape gives the
    same id) so that failures can be remembered per offer."""

    backend: str
    instance_type: str
    region: str
    cpus: int
    memory_bytes: int
    disk_bytes: int
    gpus: tuple[Gpu, ...] = ()
    zone: str = ""
    spot: bool = False
    price_per_hour: float = 0.0
    # Backend-specific details the backend needs again at launch (an AMI, a
    # fake machine's script); strings only, so it serialises as it is.
    data: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def offer_id(self) -> str:
        market = "spot" if self.spot else "on-demand"
        return "/".join([self.backend, self.region, self.zone or "-", self.instance_type, market])

    def to_data(self) -> dict[str, Any]:
        """The offer as JSON, as an instance row keeps the offer it was launched from."""
        return {
            "backend": self.backend,
            "instance_type": self.instance_type,
            "region": self.region,
            "zone": self.zone,
            "spot": self.spot,
            "price_per_hour": self.price_per_hour,
            "cpus": self.cpus,
            "memory_bytes": self.memory_bytes,
            "disk_bytes": self.disk_bytes,
            "gpus": [g.to_data() for g in self.gpus],
            "data": dict(self.data),
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any], *, where: Mapping[str, Any] | None = None) -> Offer:
        """``to_data``'s inverse. ``where``: the backend, instance type,
        region, zone and market to use where ``data`` lacks them (a row
        written before it kept its whole offer)."""
        where = where or {}

        def pick(key: str, default: Any) -> Any:
            return data.get(key, where.get(key, default))

        return cls(
            backend=str(pick("backend", "")),
            instance_type=str(pick("instance_type", "")),
            region=str(pick("region", "")),
            zone=str(pick("zone", "")),
            spot=bool(pick("spot", False)),
            price_per_hour=float(data.get("price_per_hour", 0.0)),
            cpus=int(data.get("cpus", 0)),
            memory_bytes=int(data.get("memory_bytes", 0)),
            disk_bytes=int(data.get("disk_bytes", 0)),
            gpus=tuple(Gpu.from_data(g) for g in data.get("gpus", [])),
            data={str(k): str(v) for k, v in dict(data.get("data", {})).items()},
        )


@dataclass(frozen=True)
class LaunchSpec:
    """What the machine needs to become a runner of this installation."""

    idempotency_key: str  # unique per launch attempt of one Instance row
    instance_name: str  # human name, e.g. "local-3f2a9c1e"
    runner_token: str  # the runner says hello with it
    server_url: str  # where the runner connects (http(s)://…)
    tags: Mapping[str, str] = field(default_factory=dict, hash=False)  # installation, workspace, instance, …
    # A POSIX sh script that turns a fresh machine into a runner of this
    # server (backends that boot machines from an image run it at first boot,
    # as EC2 user data); "" for backends that start the runner themselves.
    user_data: str = field(default="", repr=False)


# ``Handle.data[LAUNCHED_AT]``: when the machine was launched, Unix seconds
# as a string. Handles from ``list_managed`` carry it where the backend knows
# it, so the leak sweep leaves young machines alone.
LAUNCHED_AT = "launched_at"


@dataclass(frozen=True)
class Handle:
    """How a backend finds a machine again. ``key`` is the idempotency key
    it was launched with; ``backend_id`` the cloud's own id (pid, EC2 id)."""

    key: str
    backend_id: str = ""
    region: str = ""
    data: Mapping[str, str] = field(default_factory=dict, hash=False)


class CloudState(StrEnum):
    PENDING = "pending"  # accepted, not up yet
    RUNNING = "running"
    STOPPING = "stopping"  # shutting down or terminating
    TERMINATED = "terminated"
    INTERRUPTED = "interrupted"  # reclaimed by the cloud (spot)
    NOT_FOUND = "not_found"  # the cloud knows no such machine


GONE = frozenset({CloudState.TERMINATED, CloudState.INTERRUPTED, CloudState.NOT_FOUND})


class Trouble(StrEnum):
    """Why a machine is not doing what it was launched for, where the cloud
    says so (a Kubernetes pod's events and status). ``MachineView.reason``."""

    UNSCHEDULABLE = "unschedulable"  # PENDING: nothing can take it yet (the scheduler's words)
    IMAGE_PULL = "image_pull"  # its image cannot be pulled: it will never start
    EVICTED = "evicted"  # GONE: evicted (node pressure, a drain)
    PREEMPTED = "preempted"  # INTERRUPTED: a spot node reclaimed, or a higher priority took its place
    DELETED = "deleted"  # GONE: removed by someone other than this installation
    NODE_LOST = "node_lost"  # GONE: its node went away


@dataclass(frozen=True)
class MachineView:
    """A machine as its cloud sees it: the state, and when the cloud says
    why it is not doing what it was launched for, a ``Trouble`` and the
    cloud's own words (shown to the user as they are, bounded)."""

    state: CloudState
    reason: Trouble | None = None
    message: str = ""
    # Unix seconds since the trouble was first reported (its first event), 0 when unknown.
    since: float = 0.0


@dataclass(frozen=True)
class Timings:
    """Seconds. ``provision_timeout``: launch → the runner's hello.
    ``unreachable_grace``: a silent runner whose machine is still there keeps
    its job this long before it is fenced. ``idle_default``: an idle machine
    is retired after this long unless the workflow says otherwise."""

    provision_timeout: float
    unreachable_grace: float = 120.0
    # A launched machine reported ``Trouble.UNSCHEDULABLE`` for this long is
    # given up and its offer's scope skipped for a while (0: never).
    schedule_timeout: float = 0.0
    idle_default: float = 300.0


@dataclass(frozen=True)
class AccountConfig:
    """One connected account, as the backend sees it: plain values, with
    credentials already decrypted by the caller (never logged)."""

    account_id: str
    workspace_id: str
    kind: str
    installation: str  # tags machines as ours (TRAINYARD_INSTALLATION)
    config: Mapping[str, object] = field(default_factory=dict, hash=False)
    credentials: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)


@dataclass(frozen=True)
class MachineIdentity:
    """Who a machine is, as a document its cloud signed says: its id in the
    cloud (``Handle.backend_id``), the cloud account and the region it runs in."""

    machine_id: str
    account: str
    region: str


VolumeState = Literal["creating", "available", "in-use", "deleting", "deleted", "not_found"]


@dataclass(frozen=True)
class VolumeSpec:
    """A persistent volume to make. ``key`` (the Volume row's id) tags it:
    a second ``volume_create`` with the same key finds the first volume.
    ``zone``: the zone's name (us-east-1a); "" lets the backend pick one."""

    key: str
    name: str
    region: str
    zone: str
    size_bytes: int
    tags: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class VolumeInfo:
    """A volume as the backend sees it. ``attached_to``: the ``backend_id``
    of the machine it is attached to ("" when none); ``device``: the name it
    is attached as."""

    key: str
    backend_id: str
    region: str = ""
    zone: str = ""
    size_bytes: int = 0
    state: VolumeState = "available"
    attached_to: str = ""
    device: str = ""


class IdentityRefused(Exception):
    """A machine's signed identity does not hold; the message says why."""


class Compute(ABC):
    """A compute backend, built per account by ``registry.compute_for``.

    Errors (``errors.py``): ``NoCapacity`` / ``QuotaExceeded`` mean "try the
    next offer"; ``Transient`` means "retry the same call later";
    ``AuthFailed`` / ``InvalidConfig`` mean "stop using this account until
    the user fixes it"; ``NotYetTerminated`` means "call terminate again".
    Any other exception is a bug in the backend and is treated as transient.
    """

    kind: ClassVar[str]
    reusable_instances: ClassVar[bool]  # a VM takes job after job; a pod does not
    supports_spot: ClassVar[bool]
    timings: ClassVar[Timings]
    # The machine boots from an image and becomes a runner by running
    # ``LaunchSpec.user_data`` (EC2): the server fills it, and the token in it
    # is single-use (exchanged at the first hello for the runner's own).
    # False: the backend starts the runner itself with ``runner_token``.
    boots_from_image: ClassVar[bool] = False
    # The machine is already going when its runner hears the interruption
    # notice (a Kubernetes pod's SIGTERM is its deletion), and ``terminate``
    # waits out the machine's own grace instead of cutting it short: the
    # services ask for it at once, so the row ends (and its billing stops)
    # when the machine does, not at the notice's deadline.
    terminates_with_notice: ClassVar[bool] = False
    # The cloud signs a document naming each machine (EC2's instance identity
    # document), which its runner sends in its hello: ``identity_of`` checks
    # it, and a hello from such a machine without it is refused.
    signs_identity: ClassVar[bool] = False

    def __init__(self, account: AccountConfig) -> None:
        self.account = account

    @classmethod
    def identity_of(cls, *, document: str, signature: str, trusted_pem: str) -> MachineIdentity:
        """The machine ``document`` names, once ``signature`` shows the cloud
        signed it with a certificate of ``trusted_pem`` (PEM; "": the
        backend's shipped ones). ``IdentityRefused`` says why not. No network
        call. Only for backends with ``signs_identity``."""
        raise IdentityRefused(f"{cls.kind} machines carry no signed identity")

    @classmethod
    def cloud_account_of(cls, config: Mapping[str, object]) -> str:
        """The cloud's own id of the account an ``AccountConfig.config``
        belongs to, as a signed identity names it ("" when not known)."""
        return ""

    @abstractmethod
    def offers(self, req: Requirements) -> Iterable[Offer]:
        """Every offer that may satisfy ``req``'s placement (regions, spot
        policy, max price), from a catalog and cached account facts: no
        network call. The caller checks resources with ``shortfall`` and
        ranks by price."""

    @abstractmethod
    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        """Ask for a machine; return as soon as the backend accepted the
        request, before the machine is up. Idempotent on
        ``spec.idempotency_key``: a second call finds the first machine
        instead of starting another."""

    @abstractmethod
    def describe(self, handles: Sequence[Handle]) -> Mapping[str, CloudState]:
        """The state of each machine, keyed by ``Handle.key``, in one batched
        call. A machine the backend does not know is ``NOT_FOUND``."""

    def view(self, handles: Sequence[Handle]) -> Mapping[str, MachineView]:
        """``describe`` with the cloud's reasons, keyed by ``Handle.key``, in
        the same one batched call. The reconciler calls this, not
        ``describe``. Default: ``describe``'s states, with no reason."""
        return {key: MachineView(state) for key, state in self.describe(handles).items()}

    @abstractmethod
    def terminate(self, handle: Handle) -> None:
        """Stop the machine for good. Idempotent: a machine already gone (or
        never started) is success. Raise ``NotYetTerminated`` when the backend
        accepted the request but the machine is still going down and the
        caller should check again."""

    @abstractmethod
    def list_managed(self) -> Sequence[Handle]:
        """Every live machine this installation launched in this account (the
        leak sweep), found by tag or name, not from our own rows."""

    # Persistent volumes (docs/DATA.md, "Volumes"): "ebs", a block device
    # the server attaches to a machine; "directory", a folder of the machine
    # the runner makes (``<volumes dir>/<backend_id>``); "": none.
    volume_kind: ClassVar[str] = ""

    def volume_create(self, spec: VolumeSpec) -> VolumeInfo:
        """Make the volume. Idempotent on ``spec.key``. ``InvalidConfig``
        for a region or zone the account cannot use. Default (directory
        kinds): nothing to make; the runner makes the folder."""
        if not self.volume_kind:
            raise InvalidConfig(f"{self.kind} machines have no persistent volumes", code="NoVolumes")
        return VolumeInfo(key=spec.key, backend_id=spec.key, region=spec.region, zone=spec.zone)

    def volume_attach(self, volume: VolumeInfo, machine: Handle) -> str:
        """Attach ``volume`` to ``machine``; the device name it is attached
        as ("" for a directory). Idempotent: already attached there is
        success. ``Transient`` while it is attached elsewhere or busy."""
        return ""

    def volume_detach(self, volume: VolumeInfo, machine: Handle) -> None:
        """Detach it from ``machine``. Idempotent: not attached there (or the
        machine gone) is success."""
        return None

    def volume_delete(self, volume: VolumeInfo) -> None:
        """Delete it for good. Idempotent: already gone is success;
        ``Transient`` while it is still attached."""
        return None

    def volume_describe(self, volumes: Sequence[VolumeInfo]) -> Mapping[str, VolumeInfo]:
        """Each volume as the backend sees it now, keyed by ``key``; one it
        does not know has state ``not_found``."""
        return {v.key: v for v in volumes}

    def volumes_managed(self) -> Sequence[VolumeInfo]:
        """Every volume this installation made in this account, found by
        tag, not from our rows (the reconciler finds lost ones with it)."""
        return ()

    def provision_timeout_for(self, offer: Offer) -> float:
        """Launch → the runner's hello for a machine of ``offer`` (a backend
        whose big machines boot slower says so here)."""
        return self.timings.provision_timeout

    @classmethod
    def warm(cls) -> None:
        """Load what this kind's first call in a new process would (a cloud
        SDK's data), with no network call: the Celery worker calls it before
        it forks its pool (``TRAINYARD_WARM_BACKENDS``). Default: nothing."""
        return None

    def refresh_facts(self) -> Mapping[str, object] | None:
        """Ask the account what ``offers`` needs to know about it (zones, type
        offerings, spot prices, quotas): network calls, from a periodic task,
        never from scheduling. The services store the answer as
        ``config["facts"]``. None: this backend keeps no facts."""
        return None


def shortfall(req: Requirements, offer: Offer) -> str | None:
    """None when ``offer`` covers ``req``'s resources; else the first
    shortfall, in words a user can act on."""
    if req.cpu and req.cpu > offer.cpus:
        return f"{req.cpu} CPUs requested, {offer.cpus} available"
    if req.memory_bytes and req.memory_bytes > offer.memory_bytes:
        return f"{_gib(req.memory_bytes)} memory requested, {_gib(offer.memory_bytes)} available"
    if req.disk_bytes and req.disk_bytes > offer.disk_bytes:
        return f"{_gib(req.disk_bytes)} disk requested, {_gib(offer.disk_bytes)} available"
    if req.shm_size_bytes and req.shm_size_bytes > offer.memory_bytes:
        return f"{_gib(req.shm_size_bytes)} shared memory requested, {_gib(offer.memory_bytes)} memory available"
    return gpu_shortfall(req, offer.gpus)


def in_placement(req: Requirements, offer: Offer) -> bool:
    """True when ``offer`` is where and how ``req`` may run: in one of its
    regions (any region when it names none), in a market its spot policy
    allows ("auto" allows both), within its max price. ``offers`` filters
    with it, so every backend reads placement the same way."""
    if req.regions and offer.region not in req.regions:
        return False
    if req.spot_policy != "auto" and offer.spot != (req.spot_policy == "spot"):
        return False
    return req.max_price is None or offer.price_per_hour <= req.max_price


def gpu_shortfall(req: Requirements, gpus: Sequence[Gpu]) -> str | None:
    """None when ``gpus`` hold ``req``'s GPUs (by model and memory); else
    what is missing. The one GPU-fit rule, for a catalog's offers and for an
    idle machine's reported GPUs alike: a name matches by ``gpu_matches``
    (the same model, or an alias the models table declares; ``gpus.py``)."""
    if not req.gpu_count:
        return None
    matching = [g for g in gpus if gpu_matches(req.gpu_name, g.name, g.memory_bytes)]
    what = f"{req.gpu_count}× {req.gpu_name or 'GPU'}"
    if len(matching) < req.gpu_count:
        have = ", ".join(g.name for g in gpus) or "no GPUs"
        return f"{what} requested, this machine has {have}"
    if req.gpu_memory_bytes and sum(1 for g in matching if g.memory_bytes >= req.gpu_memory_bytes) < req.gpu_count:
        most = max(g.memory_bytes for g in matching)
        return f"{what} with {_gib(req.gpu_memory_bytes)} each requested, the largest has {_gib(most)}"
    return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"

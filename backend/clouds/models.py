"""Machines that run jobs: accounts that provision them, the instances
themselves, and each instance's history.

``clouds/services/instances.py`` is the only code that writes
``Instance.status``; every change is recorded as an ``InstanceEvent``.
"""

from __future__ import annotations

from django.db import models

from backend.accounts.models import WorkspaceOwnedModel
from backend.core.models import BaseModel


class BackendKind(models.TextChoices):
    LOCAL = "local"
    FAKE = "fake"
    SELF_HOSTED = "self-hosted"
    AWS = "aws"


class AccountStatus(models.TextChoices):
    ACTIVE = "active"
    BROKEN = "broken"  # credentials or configuration rejected: not used until fixed


class CloudAccount(WorkspaceOwnedModel):
    """How a workspace gets machines: one backend kind with its configuration
    and (encrypted) credentials."""

    kind = models.CharField(max_length=32, choices=BackendKind.choices)
    name = models.CharField(max_length=100)
    config = models.JSONField(default=dict, blank=True)
    credentials_ciphertext = models.BinaryField(blank=True, default=b"")
    status = models.CharField(max_length=16, choices=AccountStatus.choices, default=AccountStatus.ACTIVE)
    status_reason = models.CharField(max_length=1000, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="uniq_cloudaccount_name")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


class InstanceStatus(models.TextChoices):
    PROVISIONING = "provisioning"  # row committed; launch requested or under way; no hello yet
    IDLE = "idle"  # connected, no job
    BUSY = "busy"  # connected, running a job
    UNREACHABLE = "unreachable"  # its runner went silent; the backend is asked whether the machine is there
    TERMINATING = "terminating"  # terminate requested, not confirmed by the backend yet
    TERMINATED = "terminated"
    LOST = "lost"  # the machine is gone (or was fenced) without us terminating it


LIVE_STATUSES = (InstanceStatus.PROVISIONING, InstanceStatus.IDLE, InstanceStatus.BUSY, InstanceStatus.UNREACHABLE)
ENDED_STATUSES = (InstanceStatus.TERMINATED, InstanceStatus.LOST)


class InstanceReason(models.TextChoices):
    """Why an instance changed status (InstanceEvent.reason)."""

    REQUESTED = "requested"  # a job needed capacity
    LAUNCHED = "launched"  # the backend accepted the launch
    CONNECTED = "connected"  # the runner said hello
    ASSIGNED = "assigned"  # took a job
    JOB_DONE = "job_done"  # its job ended
    SILENT = "silent"  # no heartbeat within the timeout
    MACHINE_GONE = "machine_gone"  # the backend says the machine no longer exists
    INTERRUPTED = "interrupted"  # the cloud reclaimed it (spot)
    UNREACHABLE_GRACE = "unreachable_grace"  # silent for longer than the grace although the machine is there
    NO_CAPACITY = "no_capacity"  # the launch found no capacity or quota
    LAUNCH_FAILED = "launch_failed"  # the launch failed for another reason
    PROVISION_TIMEOUT = "provision_timeout"  # launched, but its runner never said hello
    IDLE_RETIRED = "idle_retired"
    MAKE_ROOM = "make_room"  # retired so another workspace's job can have its place in a shared pool
    TERMINATE_REQUESTED = "terminate_requested"
    TERMINATED = "terminated"  # the backend confirmed
    LEAK_SWEEP = "leak_sweep"  # found running with no live row
    REGISTERED = "registered"  # a self-hosted machine was registered with a registration token
    REVOKED = "revoked"  # a self-hosted runner's identity was revoked: its token is refused from then on


class Instance(WorkspaceOwnedModel):
    account = models.ForeignKey(CloudAccount, null=True, blank=True, on_delete=models.PROTECT, related_name="instances")
    backend = models.CharField(max_length=32, choices=BackendKind.choices)
    backend_id = models.CharField(max_length=200, blank=True)  # pid, EC2 id, …
    # Extra fields of the backend's Handle (strings), to find the machine again.
    backend_data = models.JSONField(default=dict, blank=True)
    # Tags the machine: a second launch with the same key finds the first machine.
    idempotency_key = models.CharField(max_length=64, blank=True, db_index=True)
    name = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=InstanceStatus.choices, default=InstanceStatus.PROVISIONING)
    status_reason = models.CharField(max_length=500, blank=True)
    termination_reason = models.CharField(max_length=32, choices=InstanceReason.choices, blank=True)
    # The offer it was launched from.
    offer_id = models.CharField(max_length=300, blank=True)
    instance_type = models.CharField(max_length=100, blank=True)
    region = models.CharField(max_length=64, blank=True)
    zone = models.CharField(max_length=64, blank=True)
    spot = models.BooleanField(default=False)
    price_per_hour = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    # The job it was started for (it may take others afterwards).
    requested_for = models.ForeignKey(
        "runs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="requested_instances"
    )
    token_hash = models.CharField(max_length=64, unique=True)
    # Machines that boot from an image (Compute.boots_from_image): the hash of
    # the single-use token in their user data, exchanged at the first hello
    # for the runner's own token (token_hash); bootstrap_used_at marks it spent.
    bootstrap_token_hash = models.CharField(max_length=64, blank=True, db_index=True)
    bootstrap_used_at = models.DateTimeField(null=True, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    # Where other jobs of a run reach this machine's jobs (Hello.address).
    address = models.CharField(max_length=255, blank=True)
    runner_version = models.CharField(max_length=50, blank=True)
    cpus = models.PositiveIntegerField(default=0)
    memory_bytes = models.PositiveBigIntegerField(default=0)
    disk_bytes = models.PositiveBigIntegerField(default=0)
    gpus = models.JSONField(default=list, blank=True)
    # The Channels name of the websocket currently connected, if any.
    channel_name = models.CharField(max_length=200, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    idle_since = models.DateTimeField(null=True, blank=True)
    unreachable_since = models.DateTimeField(null=True, blank=True)
    launched_at = models.DateTimeField(null=True, blank=True)
    connected_at = models.DateTimeField(null=True, blank=True)  # first hello
    terminate_requested_at = models.DateTimeField(null=True, blank=True)
    terminated_at = models.DateTimeField(null=True, blank=True)
    # Seconds it may stay idle for reuse, from its last job's ``idle_duration``:
    # None: the backend's default; IDLE_FOREVER: ``idle_duration: off``.
    idle_duration = models.IntegerField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["workspace", "status"], name="instance_ws_status")]

    def __str__(self) -> str:
        return self.name


IDLE_FOREVER = -1


class OfferBlock(WorkspaceOwnedModel):
    """A part of an account's offers not to try until ``until``: a launch
    failed with an error whose scope and retry-after say so (CLOUDS.md's
    table). In Postgres, so every scheduler process sees it.

    ``key`` names the blocked part within the account: the offer id
    (``offer``), ``region/zone`` (``zone``), ``region/type`` (``instance_type``),
    ``region/market/family`` (``quota``), ``region`` (``region``)."""

    account = models.ForeignKey(CloudAccount, on_delete=models.CASCADE, related_name="offer_blocks")
    scope = models.CharField(max_length=16)  # backends.errors.Scope
    key = models.CharField(max_length=300)
    code = models.CharField(max_length=100, blank=True)
    message = models.CharField(max_length=1000, blank=True)
    until = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["account", "scope", "key"], name="uniq_offer_block")]

    def __str__(self) -> str:
        return f"{self.scope} {self.key} until {self.until:%H:%M:%S}"


class InstanceEvent(WorkspaceOwnedModel):
    """One status change of an instance: what, why (an enum) and the words."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="events")
    from_status = models.CharField(max_length=16, choices=InstanceStatus.choices, blank=True)
    to_status = models.CharField(max_length=16, choices=InstanceStatus.choices)
    reason = models.CharField(max_length=32, choices=InstanceReason.choices)
    message = models.CharField(max_length=1000, blank=True)

    class Meta:
        indexes = [models.Index(fields=["instance", "created_at"], name="instance_event_at")]


class RunnerRegistrationToken(WorkspaceOwnedModel):
    """A single-use token that registers one self-hosted machine in the
    workspace (``trainyard-runner register``). Stored hashed; shown once."""

    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)  # the first characters, to tell tokens apart in a list
    note = models.CharField(max_length=100, blank=True)
    created_by = models.ForeignKey("accounts.User", null=True, on_delete=models.SET_NULL, related_name="+")
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    instance = models.ForeignKey(Instance, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}…"


class ControlPlane(BaseModel):
    """One row: when the control plane last could hear runners.

    A runner's silence only counts from ``hearing_since``: while the server
    itself was down or degraded (no web process alive, the reconciler not
    running, the database unreachable) nobody could be heard, so nobody is
    declared lost for it (docs/RUNS.md, "Unreachable and lost").
    """

    reconciled_at = models.DateTimeField(null=True, blank=True)  # the last reconcile pass
    hearing_since = models.DateTimeField(null=True, blank=True)


class WebPulse(models.Model):
    """Each web process writes its row every few seconds while it serves."""

    process = models.CharField(max_length=100, primary_key=True)  # hostname:pid
    at = models.DateTimeField()

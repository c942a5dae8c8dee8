"""Machines that run jobs: instances provisioned by a backend, or registered."""

from __future__ import annotations

from django.db import models

from backend.accounts.models import WorkspaceOwnedModel


class BackendKind(models.TextChoices):
    LOCAL = "local"
    SELF_HOSTED = "self-hosted"
    AWS = "aws"


class InstanceStatus(models.TextChoices):
    PROVISIONING = "provisioning"  # asked for; its runner has not said hello yet
    IDLE = "idle"  # connected, no job
    BUSY = "busy"  # connected, running a job
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    LOST = "lost"  # no heartbeat within the timeout


LIVE_STATUSES = (InstanceStatus.PROVISIONING, InstanceStatus.IDLE, InstanceStatus.BUSY)


class Instance(WorkspaceOwnedModel):
    backend = models.CharField(max_length=32, choices=BackendKind.choices)
    backend_id = models.CharField(max_length=200, blank=True)  # pid, EC2 id, …
    name = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=InstanceStatus.choices, default=InstanceStatus.PROVISIONING)
    status_reason = models.CharField(max_length=500, blank=True)
    token_hash = models.CharField(max_length=64, unique=True)
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
    terminated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["workspace", "status"], name="instance_ws_status")]

    def __str__(self) -> str:
        return self.name

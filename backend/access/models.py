"""A session into a running job: granted to one user for one attempt, relayed
between a client's websocket and the job's runner (docs/ACCESS.md)."""

from __future__ import annotations

from django.db import models

from backend.accounts.models import WorkspaceOwnedModel


class SessionKind(models.TextChoices):
    SSH = "ssh"
    TERMINAL = "terminal"
    PORT = "port"


class SessionState(models.TextChoices):
    GRANTED = "granted"  # waiting for the client's first connect (before grant_expires_at)
    OPEN = "open"  # a client is connected
    DETACHED = "detached"  # a terminal's client dropped; it may come back within the grace
    ENDED = "ended"  # end_reason says why


LIVE_SESSION = (SessionState.GRANTED, SessionState.OPEN, SessionState.DETACHED)


class AccessSession(WorkspaceOwnedModel):
    """Only ``services.sessions`` writes its state. The two ends of the relay
    record the channel they listen on (``client_channel``, ``runner_channel``):
    each finds its peer here."""

    user = models.ForeignKey("accounts.User", on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey("runs.Job", on_delete=models.CASCADE, related_name="+")
    attempt = models.ForeignKey("runs.Attempt", on_delete=models.CASCADE, related_name="+")
    instance = models.ForeignKey("clouds.Instance", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=SessionKind.choices)
    port = models.PositiveIntegerField(null=True, blank=True)
    token_hash = models.CharField(max_length=64, unique=True)  # sha256 of the client's token
    relay_key_hash = models.CharField(max_length=64)  # sha256 of the runner end's key
    grant_expires_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=SessionState.choices, default=SessionState.GRANTED)
    client_address = models.GenericIPAddressField(null=True, blank=True)
    client_label = models.CharField(max_length=100, blank=True)
    client_channel = models.CharField(max_length=200, blank=True)
    runner_channel = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    detached_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=500, blank=True)
    bytes_up = models.PositiveBigIntegerField(default=0)  # client → job
    bytes_down = models.PositiveBigIntegerField(default=0)  # job → client
    last_activity_at = models.DateTimeField(null=True, blank=True)
    audited_at = models.DateTimeField(null=True, blank=True)  # its end is in the audit trail

    class Meta:
        indexes = [
            models.Index(fields=["workspace", "-created_at"], name="access_session_page"),
            models.Index(fields=["attempt"], name="access_session_live", condition=models.Q(state__in=LIVE_SESSION)),
        ]

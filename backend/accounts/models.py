"""Users, workspaces (the tenants), memberships with roles, invitations, API
tokens; and the tenancy primitives every tenant-owned model of every app uses
(``WorkspaceOwnedModel``, ``WorkspaceQuerySet.for_workspace``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from backend.core.models import BaseModel


class User(AbstractUser):
    """Custom from the first migration. ``github_id`` keys GitHub sign-in.

    ``username`` is the GitHub login (``<login>-<github_id>`` while another
    account holds that name); ``github_login`` is the login exactly as GitHub
    last reported it, for finding people to add to a workspace.
    """

    github_id = models.BigIntegerField(null=True, blank=True, unique=True)
    github_login = models.CharField(max_length=39, blank=True, db_index=True)
    avatar_url = models.URLField(max_length=500, blank=True)
    # The re-check of TRAINYARD_GITHUB_ALLOW's organizations
    # (backend/accounts/services/allowlist.py): the GitHub token of the last
    # sign-in, encrypted (backend/vault/crypto.py), kept only while the
    # allowlist names organizations; when the account was last found
    # allowed; when a re-check found it no longer allowed (the account is
    # then inactive until a sign-in the allowlist lets through).
    github_token = models.BinaryField(null=True, blank=True, editable=False)
    allow_checked_at = models.DateTimeField(null=True, blank=True)
    allow_refused_at = models.DateTimeField(null=True, blank=True)


class Workspace(BaseModel):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    personal_owner = models.OneToOneField(
        User, null=True, blank=True, on_delete=models.CASCADE, related_name="personal_workspace"
    )
    # Source of run numbers (brave-otter-<n>); bumped with an atomic UPDATE.
    run_counter = models.PositiveBigIntegerField(default=0)
    # Most bytes of output a job of this workspace stores; None: the server's
    # default (TRAINYARD_LOG_CAP_BYTES). Set by a server admin (Django admin).
    log_cap_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    # Bytes this workspace may keep in storage (artifacts, checkpoints, caches,
    # code blobs); None: the installation's TRAINYARD_STORAGE_QUOTA_BYTES.
    # Set by an installation admin (Django admin), not by the workspace.
    storage_quota_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    # Who made a team workspace (None: a personal one, or its maker is gone):
    # what TRAINYARD_MAX_WORKSPACES_PER_USER counts.
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The guards a workflow of this workspace gets when it has no key of its
    # own (``utilization_policy``, ``stall``; docs/WORKFLOWS.md, "Guards"),
    # written as in a workflow: {"stall": {"timeout": "20m", "action": "restart"}}.
    # {}: none. Set by the workspace's admins (API, `trainyard guards set`) or
    # an installation admin (Django admin); read at submission.
    guard_defaults = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        from backend.accounts.guards import guard_defaults_problems

        problems = guard_defaults_problems(self.guard_defaults)
        if problems:
            raise ValidationError({"guard_defaults": problems})


class WorkspaceQuerySet(models.QuerySet):
    """Tenancy fails closed: reads of tenant data go through for_workspace()."""

    def for_workspace(self, workspace: Workspace) -> WorkspaceQuerySet:
        return self.filter(workspace=workspace)


class WorkspaceOwnedModel(BaseModel):
    """The base of every tenant-owned model: it belongs to exactly one workspace."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")

    objects: Any = WorkspaceQuerySet.as_manager()

    class Meta:
        abstract = True


class Role(models.TextChoices):
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


# Who may do what another role may: a role can do everything a lower one can.
ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2}


class Membership(WorkspaceOwnedModel):
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "user"], name="uniq_membership")]


def invitation_expiry() -> datetime:
    """When an invitation made now expires (``TRAINYARD_INVITATION_DAYS``)."""
    return timezone.now() + timedelta(days=settings.TRAINYARD["INVITATION_DAYS"])


class Invitation(WorkspaceOwnedModel):
    """A role offered to a GitHub login or an email, taken up at that person's next sign-in.

    Exactly one of ``github_login`` / ``email`` is set, stored lower-cased;
    an email invitation is only ever matched against a GitHub-verified email.
    ``github_id``, when the inviter names it, is what a login invitation
    matches (GitHub gives a freed login to someone else): only the account
    with that id takes it up, whatever its login is by then.
    """

    github_login = models.CharField(max_length=39, blank=True)
    github_id = models.BigIntegerField(null=True, blank=True)
    email = models.EmailField(blank=True)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    invited_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # Not taken up by then: ignored at sign-in and not listed (inviting again renews it).
    expires_at = models.DateTimeField(default=invitation_expiry)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(github_login="") & ~models.Q(email=""))
                | (~models.Q(github_login="") & models.Q(email="")),
                name="invitation_login_xor_email",
            ),
            # One pending invitation per person and workspace: inviting again changes its role.
            models.UniqueConstraint(
                fields=["workspace", "github_login"],
                condition=models.Q(accepted_at__isnull=True) & ~models.Q(github_login=""),
                name="uniq_pending_invitation_login",
            ),
            models.UniqueConstraint(
                fields=["workspace", "email"],
                condition=models.Q(accepted_at__isnull=True) & ~models.Q(email=""),
                name="uniq_pending_invitation_email",
            ),
        ]


class ApiToken(BaseModel):
    """A personal token; only its sha256 is stored, the token is shown once."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, default="cli")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # None: never expires (chosen at creation, `expires_in`).
    expires_at = models.DateTimeField(null=True, blank=True)


class DeviceLoginState(models.TextChoices):
    PENDING = "pending"  # waiting for a signed-in person to approve or deny its code
    APPROVED = "approved"  # approved: the device's next poll gets a token
    DENIED = "denied"
    ISSUED = "issued"  # the token was handed to the device: the request is spent


class DeviceLogin(BaseModel):
    """A device-code sign-in (RFC 8628) of ``trainyard login``: the CLI holds
    the device code (only its sha256 is stored) and polls; a signed-in person
    enters the short ``user_code`` on the dashboard and approves it, and the
    next poll gets a new API token of that person, named ``client_name``
    (backend/accounts/services/device_login.py)."""

    device_code_hash = models.CharField(max_length=64, unique=True)
    user_code = models.CharField(max_length=8)  # stored without the dash shown in the middle
    client_name = models.CharField(max_length=100)
    address = models.GenericIPAddressField(null=True, blank=True)  # where the request came from
    state = models.CharField(max_length=16, choices=DeviceLoginState.choices, default=DeviceLoginState.PENDING)
    user = models.ForeignKey(User, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    interval = models.PositiveIntegerField()  # seconds the device waits between polls
    polled_at = models.DateTimeField(null=True, blank=True)
    token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user_code"], condition=models.Q(state="pending"), name="uniq_pending_device_user_code"
            )
        ]
        indexes = [models.Index(fields=["expires_at"], name="accounts_device_expiry")]


class SshKey(BaseModel):
    """An SSH public key of a user: what the runner's SSH server lets that
    user in with, in every workspace where the user may open a session
    (backend/accounts/services/ssh_keys.py parses and checks it).
    ``public_key`` is one OpenSSH line, ``<type> <base64>``, as parsed (no
    comment, no options); ``fingerprint`` is what ``ssh-keygen -l`` prints."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=100)
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=64)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "fingerprint"], name="uniq_ssh_key_per_user")]


class LockoutPer(models.TextChoices):
    USERNAME = "user", "username"
    ADDRESS = "ip", "address"


class SignInLockout(BaseModel):
    """A username, or a client address, locked out of password sign-in until
    ``locked_until`` (backend/accounts/services/lockout.py), the right password
    too. Not tenant data: for operators, in the Django admin, where one is
    lifted early (its action sets ``locked_until`` to now). Kept after it ends,
    as a record; records older than ``LOCKOUT_RECORDS_KEPT`` go."""

    per = models.CharField(max_length=8, choices=LockoutPer.choices)
    identity = models.CharField(max_length=150, help_text="The username (lowercased), or the client address.")
    failures = models.PositiveIntegerField(help_text="Wrong passwords counted within the period when it began.")
    locked_until = models.DateTimeField()
    last_username = models.CharField(max_length=150, blank=True, help_text="The username of the last wrong password.")
    last_address = models.CharField(max_length=64, blank=True, help_text="The address of the last wrong password.")

    class Meta:
        indexes = [models.Index(fields=["per", "identity", "locked_until"], name="accounts_lockout_active")]

    def __str__(self) -> str:
        return f"{self.get_per_display()} {self.identity} until {self.locked_until:%Y-%m-%d %H:%M:%S} UTC"


class AuditKind(models.TextChoices):
    SECRET = "secret"
    CREDENTIAL = "credential"
    MEMBER = "member"
    BACKEND = "backend"
    TOKEN = "token"
    RUNNER = "runner"
    SSH_KEY = "ssh_key", "SSH key"
    SESSION = "session"  # a session into a running job (ssh, terminal, port): its start and its end
    WORKSPACE = "workspace"  # a setting of the workspace its admins change (its default guards)
    BUDGET = "budget"  # a budget or GPU quota set or removed, a run let past the budgets


class AuditEvent(WorkspaceOwnedModel):
    """One security-relevant change in a workspace: who (a user, or a runner
    acting with its own token), what (``kind`` and ``action``, on ``target``),
    when (``created_at``) and from where (the client's address). Never a
    secret's value; written by ``services.audit.audit_record`` in the
    change's transaction, read by the workspace's admins."""

    kind = models.CharField(max_length=16, choices=AuditKind.choices)
    action = models.CharField(max_length=64)  # "<kind>.<verb>": secret.set, member.removed …
    target = models.CharField(max_length=300, blank=True)  # a secret's name, a login, a backend's name …
    user = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # Kept when the user is deleted: the record says who it was.
    username = models.CharField(max_length=150, blank=True)
    runner = models.CharField(max_length=200, blank=True)  # the runner (instance) name, when a runner acted
    address = models.GenericIPAddressField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["workspace", "-created_at", "-id"], name="accounts_audit_page"),
            models.Index(fields=["workspace", "kind", "-created_at", "-id"], name="accounts_audit_kind_page"),
        ]

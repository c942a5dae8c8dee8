"""Users, workspaces (the tenants), memberships with roles, API tokens."""

from __future__ import annotations

from django.contrib.auth.models import AbstractUser
from django.db import models

from backend.core.models import BaseModel, WorkspaceOwnedModel


class User(AbstractUser):
    """Custom from the first migration. ``github_id`` keys GitHub sign-in."""

    github_id = models.BigIntegerField(null=True, blank=True, unique=True)


class Workspace(BaseModel):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    personal_owner = models.OneToOneField(
        User, null=True, blank=True, on_delete=models.CASCADE, related_name="personal_workspace"
    )
    # Source of run numbers (brave-otter-<n>); bumped with an atomic UPDATE.
    run_counter = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


class Membership(WorkspaceOwnedModel):
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "user"], name="uniq_membership")]


class ApiToken(BaseModel):
    """A personal token; only its sha256 is stored, the token is shown once."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, default="cli")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

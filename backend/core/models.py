"""Base model and the tenancy primitives every tenant-owned model uses."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.db import models

if TYPE_CHECKING:
    from backend.accounts.models import Workspace


class BaseModel(models.Model):
    """UUID primary key (public ids are UUIDs) and timestamps."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class WorkspaceQuerySet(models.QuerySet):
    """Tenancy fails closed: reads of tenant data go through for_workspace()."""

    def for_workspace(self, workspace: Workspace) -> WorkspaceQuerySet:
        return self.filter(workspace=workspace)


class WorkspaceOwnedModel(BaseModel):
    workspace = models.ForeignKey("accounts.Workspace", on_delete=models.CASCADE, related_name="+")

    objects: Any = WorkspaceQuerySet.as_manager()

    class Meta:
        abstract = True

"""The base model every model of the project uses.

Tenancy (the ``workspace`` key and ``for_workspace()``) belongs to the app
that owns workspaces: ``backend.accounts.models.WorkspaceOwnedModel``.
"""

from __future__ import annotations

import uuid

from django.db import models


class BaseModel(models.Model):
    """UUID primary key (public ids are UUIDs) and timestamps."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True

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


class ParkedTask(BaseModel):
    """A Celery task whose worker died under it ``TRAINYARD_TASK_MAX_DELIVERIES``
    times: it is not run again (``backend.core.deliveries``). For operators
    (Django admin); not tenant data, so no workspace."""

    task_name = models.CharField(max_length=200)
    task_id = models.CharField(max_length=100, db_index=True)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    deaths = models.PositiveIntegerField()
    # What the task was working on when its worker died (``note_subject``), e.g. "job:<id>".
    subject = models.CharField(max_length=200, blank=True)
    # What was marked failed for it (its app's park handler), or why nothing was.
    outcome = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.task_name} [{self.task_id}]"

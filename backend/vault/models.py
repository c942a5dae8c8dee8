"""Workspace secrets: injected into jobs as environment variables.

Values are encrypted at rest (see vault.crypto) and never returned by the API.
"""

from __future__ import annotations

from django.db import models

from backend.accounts.models import WorkspaceOwnedModel


class Secret(WorkspaceOwnedModel):
    name = models.CharField(max_length=200)
    ciphertext = models.BinaryField()
    created_by = models.ForeignKey("accounts.User", null=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="uniq_secret_name")]

    def __str__(self) -> str:
        return self.name

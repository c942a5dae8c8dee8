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


class CredentialKind(models.TextChoices):
    HTTPS_TOKEN = "https-token"  # HTTP Basic auth: username (optional) + token
    SSH_KEY = "ssh-key"  # a private deploy key


class RepoCredential(WorkspaceOwnedModel):
    """How the runner clones one private repository. The secret (token or
    private key) is encrypted at rest and never returned by the API; it is
    handed to the runner in a job's assignment and masked in logs and reasons."""

    repo = models.OneToOneField("repos.Repo", on_delete=models.CASCADE, related_name="credential")
    kind = models.CharField(max_length=16, choices=CredentialKind.choices)
    username = models.CharField(max_length=200, blank=True)  # https-token only
    ciphertext = models.BinaryField()
    created_by = models.ForeignKey("accounts.User", null=True, on_delete=models.SET_NULL, related_name="+")

    def __str__(self) -> str:
        return f"{self.kind} for {self.repo_id}"

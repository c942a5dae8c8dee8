"""Connected repositories: the git remotes a workspace runs from."""

from __future__ import annotations

from django.db import models

from backend.accounts.models import WorkspaceOwnedModel


class Repo(WorkspaceOwnedModel):
    """Recorded the first time a run comes from a remote; GitHub connection
    and deploy keys arrive with the dashboard."""

    url = models.CharField(max_length=500)
    name = models.CharField(max_length=200)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "url"], name="uniq_repo_url")]

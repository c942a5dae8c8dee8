"""Writes of connected repositories."""

from __future__ import annotations

from backend.accounts.models import Workspace
from backend.core.urlcreds import url_without_credentials
from backend.repos.models import Repo


def repo_get_or_create(*, workspace: Workspace, url: str) -> Repo:
    """The workspace's repo of ``url``, recorded the first time it is named
    (without a credential the URL may carry: everyone in the workspace sees it)."""
    url = url_without_credentials(url)
    name = url.rstrip("/").removesuffix(".git").rsplit("/", 1)[-1].rsplit(":", 1)[-1] or url
    repo, _ = Repo.objects.get_or_create(workspace=workspace, url=url, defaults={"name": name})
    return repo

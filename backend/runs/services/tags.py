"""Tags: workspace-unique names for successful runs."""

from __future__ import annotations

import re

from django.db import transaction

from backend.accounts.models import User, Workspace
from backend.core.errors import ApplicationError
from backend.runs.models import Run, RunStatus, Tag

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def tag_set(*, workspace: Workspace, user: User, name: str, run: Run, force: bool) -> tuple[Tag, str]:
    """Point ``name`` at ``run``. Returns (tag, "created" | "moved" | "unchanged")."""
    if not NAME_RE.match(name):
        raise ApplicationError(
            f"{name!r} is not a valid tag name: letters, digits, '.', '_' and '-', starting with a letter or digit."
        )
    if run.status != RunStatus.SUCCEEDED:
        raise ApplicationError(f"Run {run.name} {run.status}: only a successful run can be tagged.")
    with transaction.atomic():
        tag = Tag.objects.for_workspace(workspace).select_for_update().select_related("run").filter(name=name).first()
        if tag is None:
            return Tag.objects.create(workspace=workspace, name=name, run=run, created_by=user), "created"
        if tag.run_id == run.pk:
            return tag, "unchanged"
        if not force:
            raise ApplicationError(
                f"Tag {name} already points to run {tag.run.name}; use force to move it.", status_code=409
            )
        Tag.objects.filter(pk=tag.pk).update(run=run, created_by=user)
        tag.refresh_from_db()
        return tag, "moved"


def tag_delete(*, workspace: Workspace, name: str) -> bool:
    deleted, _ = Tag.objects.for_workspace(workspace).filter(name=name).delete()
    return bool(deleted)

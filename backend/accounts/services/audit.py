"""The audit log: who changed what of a workspace's security, when and from
where (docs/SECURITY.md, "Audit log"). The API views record their change
once it is made, naming the caller (``Actor``); a runner's own acts name
the runner. A record never holds a secret's value or a token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from backend.accounts.models import AuditEvent, AuditKind, User


@dataclass(frozen=True)
class Actor:
    """Who acted: a signed-in user, or a runner with its own token; and the
    client's address (``REMOTE_ADDR``)."""

    user: User | None = None
    runner: str = ""
    address: str = ""


def audit_record(
    *,
    workspace_id: UUID,
    kind: AuditKind,
    action: str,
    actor: Actor,
    target: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    """One event of ``workspace_id``; ``action`` is ``<kind>.<verb>``."""
    return AuditEvent.objects.create(
        workspace_id=workspace_id,
        kind=kind,
        action=action,
        target=target[:300],
        user=actor.user,
        username=actor.user.username if actor.user is not None else "",
        runner=actor.runner[:200],
        address=actor.address or None,
        detail=detail or {},
    )

"""The one workspace-scoped base every tenant API view of every app inherits.

It resolves ``<workspace>`` from the URL against the caller's memberships
(404 when not a member: another tenant's workspace does not exist for you)
and enforces the role a write needs (viewers read only), and for the few
reads that are not for everyone the role a read needs (``read_role``).
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.views import APIView

from backend.accounts.auth import signed_in_user
from backend.accounts.models import ROLE_RANK, AuditKind, Membership, Role, Workspace
from backend.accounts.selectors import membership_get
from backend.accounts.services.audit import Actor, audit_record
from backend.core.errors import ApplicationError, NotFound
from backend.core.ratelimit import client_ip

WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class WorkspaceAPIView(APIView):
    """Sets ``self.workspace`` and ``self.membership``; writes need ``write_role``."""

    write_role: Role = Role.MEMBER
    read_role: Role = Role.VIEWER
    workspace: Workspace
    membership: Membership

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        membership = membership_get(user=signed_in_user(request), workspace_slug=kwargs.get("workspace", ""))
        if membership is None:
            raise NotFound(f"Workspace {kwargs.get('workspace')!r} not found.")
        rank = ROLE_RANK[Role(membership.role)]
        if request.method in WRITE_METHODS and rank < ROLE_RANK[self.write_role]:
            can = "it cannot make changes" if rank == 0 else f"only {self.write_role}s can make this change"
            raise ApplicationError(
                f"Your role in {membership.workspace.slug} is {membership.role}: {can}.", status_code=403
            )
        if request.method not in WRITE_METHODS and rank < ROLE_RANK[self.read_role]:
            raise ApplicationError(
                f"Your role in {membership.workspace.slug} is {membership.role}: only {self.read_role}s see this.",
                status_code=403,
            )
        self.membership = membership
        self.workspace = membership.workspace

    def audit(self, kind: AuditKind, action: str, target: str = "", detail: dict[str, Any] | None = None) -> None:
        """Record this request's change in the workspace's audit log, naming
        the caller and their address."""
        actor = Actor(user=signed_in_user(self.request), address=client_ip(self.request))
        audit_record(
            workspace_id=self.workspace.pk, kind=kind, action=action, actor=actor, target=target, detail=detail
        )

"""Workspaces, members and invitations: everyone in a workspace reads, its admins change."""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.accounts.auth import signed_in_user
from backend.accounts.guards import guard_defaults_written
from backend.accounts.models import AuditEvent, AuditKind, Membership, Role
from backend.accounts.selectors import audit_page, invitations_pending, members_of, memberships_of
from backend.accounts.services.workspaces import (
    invitation_revoke,
    member_add,
    member_remove,
    member_role_set,
    workspace_create_team,
    workspace_guard_defaults_set,
)
from backend.accounts.tenancy import WorkspaceAPIView
from backend.core.errors import ApplicationError

# GitHub logins: letters, digits and single hyphens, at most 39 characters.
GITHUB_LOGIN = r"^[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}$"


class WorkspaceIn(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    slug = serializers.SlugField(max_length=64, required=False, allow_blank=True)


class WorkspaceOut(serializers.Serializer):
    slug = serializers.SlugField()
    name = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.choices)
    personal = serializers.BooleanField()


class MemberIn(serializers.Serializer):
    github_login = serializers.RegexField(GITHUB_LOGIN, required=False, allow_blank=True)
    email = serializers.EmailField(required=False, allow_blank=True)
    github_id = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=2**53,
        help_text="GitHub's numeric id of github_login: only that account matches (GitHub recycles logins).",
    )
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if bool(attrs.get("github_login")) == bool(attrs.get("email")):
            raise serializers.ValidationError("Give either github_login or email.")
        if attrs.get("github_id") is not None and not attrs.get("github_login"):
            raise serializers.ValidationError("github_id goes with the github_login it belongs to.")
        return attrs


class RoleIn(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class MemberOut(serializers.Serializer):
    username = serializers.CharField(source="user.username")
    role = serializers.ChoiceField(choices=Role.choices)
    avatar_url = serializers.CharField(source="user.avatar_url")
    joined_at = serializers.DateTimeField(source="created_at")


class InvitationOut(serializers.Serializer):
    id = serializers.UUIDField()
    github_login = serializers.CharField()
    github_id = serializers.IntegerField(allow_null=True, help_text="null: matched by the login")
    email = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.choices)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()


class WorkspaceListView(APIView):
    """The caller's workspaces; creating one makes the caller its admin."""

    @extend_schema(responses=WorkspaceOut(many=True))
    def get(self, request: Request) -> Response:
        return Response([_workspace_out(m) for m in memberships_of(user=signed_in_user(request))])

    @extend_schema(request=WorkspaceIn, responses={201: WorkspaceOut})
    def post(self, request: Request) -> Response:
        data = WorkspaceIn(data=request.data)
        data.is_valid(raise_exception=True)
        workspace = workspace_create_team(user=signed_in_user(request), **data.validated_data)
        return Response(
            {"slug": workspace.slug, "name": workspace.name, "role": Role.ADMIN, "personal": False}, status=201
        )


class MemberListView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(responses=MemberOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        return Response(MemberOut(members_of(workspace=self.workspace), many=True).data)

    @extend_schema(
        request=MemberIn,
        responses={
            201: inline_serializer("MemberAdded", {"member": MemberOut()}),
            202: inline_serializer("MemberInvited", {"invitation": InvitationOut()}),
        },
    )
    def post(self, request: Request, workspace: str) -> Response:
        data = MemberIn(data=request.data)
        data.is_valid(raise_exception=True)
        added = member_add(workspace=self.workspace, invited_by=signed_in_user(request), **data.validated_data)
        if added.membership is not None:
            self.audit(
                AuditKind.MEMBER, "member.added", added.membership.user.username, {"role": added.membership.role}
            )
            return Response({"member": MemberOut(added.membership).data}, status=201)
        invitation = added.invitation
        who = invitation.github_login or invitation.email if invitation is not None else ""
        self.audit(AuditKind.MEMBER, "member.invited", who, {"role": invitation.role if invitation is not None else ""})
        return Response({"invitation": InvitationOut(added.invitation).data}, status=202)


class MemberDetailView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(request=RoleIn, responses=MemberOut)
    def patch(self, request: Request, workspace: str, username: str) -> Response:
        data = RoleIn(data=request.data)
        data.is_valid(raise_exception=True)
        membership = member_role_set(workspace=self.workspace, username=username, role=data.validated_data["role"])
        self.audit(AuditKind.MEMBER, "member.role_changed", username, {"role": membership.role})
        return Response(MemberOut(membership).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str, username: str) -> Response:
        member_remove(workspace=self.workspace, username=username)
        self.audit(AuditKind.MEMBER, "member.removed", username)
        return Response(status=204)


class InvitationListView(WorkspaceAPIView):
    """Pending invitations name people who are not members yet: admins only."""

    read_role = Role.ADMIN

    @extend_schema(responses=InvitationOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        return Response(InvitationOut(invitations_pending(workspace=self.workspace), many=True).data)


class InvitationDetailView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str, invitation: uuid.UUID) -> Response:
        invitation_revoke(workspace=self.workspace, invitation_id=invitation)
        self.audit(AuditKind.MEMBER, "member.invitation_revoked", str(invitation))
        return Response(status=204)


class AuditEventOut(serializers.Serializer):
    id = serializers.UUIDField()
    at = serializers.DateTimeField(source="created_at")
    kind = serializers.ChoiceField(choices=AuditKind.choices)
    action = serializers.CharField(help_text="<kind>.<verb>: secret.created, member.removed, runner.registered …")
    target = serializers.CharField(help_text="what it was done to: a secret's name, a login, a backend …")
    actor = serializers.SerializerMethodField(help_text="user or runner")
    username = serializers.CharField(help_text="the user who acted ('' when a runner did)")
    runner = serializers.CharField(help_text="the runner that acted with its own token ('' when a user did)")
    address = serializers.CharField(allow_null=True, help_text="the client's IP address")
    detail = serializers.DictField()

    def get_actor(self, event: AuditEvent) -> str:
        return "runner" if event.runner else "user"


class AuditPageOut(serializers.Serializer):
    next = serializers.CharField(allow_null=True, help_text="the next page's URL; null on the last")
    results = AuditEventOut(many=True)


class AuditListView(WorkspaceAPIView):
    """The workspace's audit log, newest first: admins only."""

    read_role = Role.ADMIN

    @extend_schema(
        responses=AuditPageOut,
        parameters=[
            OpenApiParameter("kind", str, enum=AuditKind.values, description="only events of this kind"),
            OpenApiParameter("cursor", str, description="the `next` link's cursor of the previous page"),
            OpenApiParameter("page_size", int, description="events per page (default 50, at most 500)"),
        ],
    )
    def get(self, request: Request, workspace: str) -> Response:
        params = request.query_params
        page = audit_page(
            workspace=self.workspace,
            kind=params.get("kind", ""),
            cursor=params.get("cursor", ""),
            size=_page_size(params.get("page_size", "")),
        )
        next_url = None
        if page.next:
            query = params.copy()
            query["cursor"] = page.next
            next_url = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        return Response({"next": next_url, "results": AuditEventOut(page.events, many=True).data})


_DURATION = "a duration as in a workflow: 30m, 2h, 1h30m, 1d"


class UtilizationPolicyDefault(serializers.Serializer):
    min_gpu_utilization = serializers.IntegerField(
        min_value=1, max_value=100, help_text="percent: every GPU below it for the whole window stops the job"
    )
    time_window = serializers.CharField(help_text=_DURATION)


class StallPolicyDefault(serializers.Serializer):
    timeout = serializers.CharField(help_text=f"no new log line and no new metric value for this long; {_DURATION}")
    action = serializers.ChoiceField(
        choices=[("stop", "stop"), ("restart", "restart")],
        default="stop",
        help_text="stop the job, or end the attempt and start the next from its last checkpoint",
    )


class GuardDefaultsIn(serializers.Serializer):
    utilization_policy = UtilizationPolicyDefault(
        required=False, allow_null=True, help_text="left out or null: no default"
    )
    stall = StallPolicyDefault(required=False, allow_null=True, help_text="left out or null: no default")


class GuardDefaultsOut(serializers.Serializer):
    utilization_policy = UtilizationPolicyDefault(allow_null=True, help_text="null: no default")
    stall = StallPolicyDefault(allow_null=True, help_text="null: no default")


class GuardDefaultsView(WorkspaceAPIView):
    """The guards a run of this workspace gets where its workflow has no key
    of its own (docs/WORKFLOWS.md, "Guards"): every member and viewer
    reads them, admins replace them. Written as in a workflow and checked as
    a workflow's keys are; a change applies to runs submitted after it."""

    write_role = Role.ADMIN

    @extend_schema(responses=GuardDefaultsOut)
    def get(self, request: Request, workspace: str) -> Response:
        return Response(guard_defaults_written(self.workspace.guard_defaults))

    @extend_schema(request=GuardDefaultsIn, responses=GuardDefaultsOut)
    def put(self, request: Request, workspace: str) -> Response:
        change = workspace_guard_defaults_set(workspace=self.workspace, value=request.data)
        if change.changed:
            self.audit(
                AuditKind.WORKSPACE,
                "workspace.guards_set",
                self.workspace.slug,
                {"before": change.before, "after": change.after},
            )
        return Response(change.after)


def _page_size(text: str) -> int:
    if not text:
        return 50
    if not text.isdigit() or not 1 <= int(text) <= 500:
        raise ApplicationError("page_size is a whole number from 1 to 500.", extra={"field": "page_size"})
    return int(text)


def _workspace_out(membership: Membership) -> dict[str, Any]:
    workspace = membership.workspace
    personal = workspace.personal_owner_id is not None
    return {"slug": workspace.slug, "name": workspace.name, "role": membership.role, "personal": personal}

"""Workspaces, members and invitations: everyone in a workspace reads, its admins change."""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.accounts.auth import signed_in_user
from backend.accounts.models import Membership, Role
from backend.accounts.selectors import invitations_pending, members_of, memberships_of
from backend.accounts.services.workspaces import (
    invitation_revoke,
    member_add,
    member_remove,
    member_role_set,
    workspace_create_team,
)
from backend.accounts.tenancy import WorkspaceAPIView

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
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if bool(attrs.get("github_login")) == bool(attrs.get("email")):
            raise serializers.ValidationError("Give either github_login or email.")
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
            return Response({"member": MemberOut(added.membership).data}, status=201)
        return Response({"invitation": InvitationOut(added.invitation).data}, status=202)


class MemberDetailView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(request=RoleIn, responses=MemberOut)
    def patch(self, request: Request, workspace: str, username: str) -> Response:
        data = RoleIn(data=request.data)
        data.is_valid(raise_exception=True)
        membership = member_role_set(workspace=self.workspace, username=username, role=data.validated_data["role"])
        return Response(MemberOut(membership).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str, username: str) -> Response:
        member_remove(workspace=self.workspace, username=username)
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
        return Response(status=204)


def _workspace_out(membership: Membership) -> dict[str, Any]:
    workspace = membership.workspace
    personal = workspace.personal_owner_id is not None
    return {"slug": workspace.slug, "name": workspace.name, "role": membership.role, "personal": personal}

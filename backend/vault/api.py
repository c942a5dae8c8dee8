"""Secrets API: names and dates only; a value goes in and never comes out."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.auth import signed_in_user
from backend.accounts.models import AuditKind, Role
from backend.accounts.tenancy import WorkspaceAPIView
from backend.core.errors import NotFound
from backend.vault.services import secret_delete, secret_list, secret_set


class SecretIn(serializers.Serializer):
    value = serializers.CharField(trim_whitespace=False, max_length=65536)


class SecretOut(serializers.Serializer):
    name = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    readable = serializers.BooleanField(
        default=True, help_text="false: no key of the server opens the value; jobs of the workspace fail until fixed"
    )
    problem = serializers.CharField(default="", help_text="when not readable: what is wrong and what to do")


class SecretListView(WorkspaceAPIView):
    @extend_schema(responses=SecretOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        return Response(SecretOut(secret_list(workspace=self.workspace), many=True).data)


class SecretDetailView(WorkspaceAPIView):
    """Setting or deleting a secret is an admin's: a secret's value reaches
    every job that names it, so who sets it decides what jobs run with."""

    write_role = Role.ADMIN

    @extend_schema(request=SecretIn, responses={200: SecretOut, 201: SecretOut})
    def put(self, request: Request, workspace: str, name: str) -> Response:
        data = SecretIn(data=request.data)
        data.is_valid(raise_exception=True)
        secret, created = secret_set(
            workspace=self.workspace, user=signed_in_user(request), name=name, value=data.validated_data["value"]
        )
        self.audit(AuditKind.SECRET, "secret.created" if created else "secret.replaced", name)
        return Response(SecretOut(secret).data, status=201 if created else 200)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str, name: str) -> Response:
        if not secret_delete(workspace=self.workspace, name=name):
            raise NotFound(f"Secret {name!r} not found.")
        self.audit(AuditKind.SECRET, "secret.deleted", name)
        return Response(status=204)

"""The workspace's S3-compatible data endpoint (docs/DATA.md): shown to its
members, set and removed by its admins. The secret goes in and never comes
out."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.models import AuditKind, Role
from backend.accounts.tenancy import WorkspaceAPIView
from backend.core.errors import NotFound
from backend.data.models import DataEndpoint
from backend.data.services import data_endpoint_remove, data_endpoint_set


class DataEndpointOut(serializers.ModelSerializer[DataEndpoint]):
    has_secret = serializers.SerializerMethodField()

    class Meta:
        model = DataEndpoint
        fields = ["endpoint_url", "region", "access_key_id", "has_secret", "created_at", "updated_at"]
        read_only_fields = fields

    def get_has_secret(self, endpoint: DataEndpoint) -> bool:
        return bool(endpoint.secret_access_key_ciphertext)


class DataEndpointIn(serializers.Serializer[Any]):
    endpoint_url = serializers.CharField(max_length=500)
    region = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    access_key_id = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    secret_access_key = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default="", write_only=True, trim_whitespace=True
    )


class DataEndpointView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(responses=DataEndpointOut)
    def get(self, request: Request, workspace: str) -> Response:
        endpoint = DataEndpoint.objects.for_workspace(self.workspace).first()
        if endpoint is None:
            raise NotFound(f"workspace {self.workspace.slug} has no data endpoint (trainyard data endpoint set URL)")
        return Response(DataEndpointOut(endpoint).data)

    @extend_schema(request=DataEndpointIn, responses=DataEndpointOut)
    def put(self, request: Request, workspace: str) -> Response:
        data = DataEndpointIn(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint = data_endpoint_set(workspace=self.workspace, **data.validated_data)
        self.audit(AuditKind.BACKEND, "backend.data_endpoint_set", endpoint.endpoint_url)
        return Response(DataEndpointOut(endpoint).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str) -> Response:
        if not data_endpoint_remove(workspace=self.workspace):
            raise NotFound(f"workspace {self.workspace.slug} has no data endpoint")
        self.audit(AuditKind.BACKEND, "backend.data_endpoint_removed")
        return Response(status=204)

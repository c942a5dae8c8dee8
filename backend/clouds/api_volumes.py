"""A workspace's persistent volumes (docs/API.md, "Volumes"): viewers list
them, members create and delete them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.auth import signed_in_user
from backend.accounts.models import AuditKind, Role
from backend.accounts.tenancy import WorkspaceAPIView
from backend.clouds.models import Volume
from backend.clouds.services.volumes import VOLUME_BACKENDS, volume_create, volume_delete, volume_get, volumes_of


class VolumeAttachedOut(serializers.Serializer[Any]):
    run = serializers.CharField()
    job = serializers.UUIDField()
    job_name = serializers.CharField()
    job_status = serializers.CharField()


class VolumeOut(serializers.ModelSerializer[Volume]):
    account = serializers.SerializerMethodField()
    machine = serializers.SerializerMethodField()
    attached_machine = serializers.SerializerMethodField()
    attached_to = serializers.SerializerMethodField()

    class Meta:
        model = Volume
        fields = [
            "id",
            "name",
            "backend",
            "account",
            "region",
            "zone",
            "size_bytes",
            "backend_id",
            "status",
            "status_reason",
            "machine",
            "attached_machine",
            "attached_to",
            "device",
            "created_at",
        ]

    def get_account(self, volume: Volume) -> str | None:
        return volume.account.name if volume.account else None

    def get_machine(self, volume: Volume) -> str | None:
        """The self-hosted machine the volume is a folder of."""
        return volume.machine.name if volume.machine else None

    def get_attached_machine(self, volume: Volume) -> str | None:
        """The machine it is attached to now."""
        return volume.attached_instance.name if volume.attached_instance else None

    @extend_schema_field(VolumeAttachedOut(allow_null=True))
    def get_attached_to(self, volume: Volume) -> dict[str, Any] | None:
        """The job holding it (with its run), while that job may still run."""
        job = volume.attached_job
        if job is None or job.status not in ("pending", "assigned", "running", "stopping"):
            return None
        return {"run": job.run.name, "job": job.pk, "job_name": job.name, "job_status": job.status}


class VolumeCreateIn(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=63)
    size = serializers.CharField(max_length=32)
    backend = serializers.ChoiceField(choices=list(VOLUME_BACKENDS))
    region = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    zone = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    machine = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class VolumeListView(WorkspaceAPIView):
    write_role = Role.MEMBER

    @extend_schema(responses=VolumeOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        return Response(VolumeOut(volumes_of(workspace_id=self.workspace.pk), many=True).data)

    @extend_schema(request=VolumeCreateIn, responses={201: VolumeOut})
    def post(self, request: Request, workspace: str) -> Response:
        data = VolumeCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        volume = volume_create(workspace=self.workspace, user=signed_in_user(request), **data.validated_data)
        self.audit(AuditKind.BACKEND, "volume.created", volume.name, {"backend": volume.backend})
        return Response(VolumeOut(volume_get(workspace_id=self.workspace.pk, name=volume.name)).data, status=201)


class VolumeDetailView(WorkspaceAPIView):
    write_role = Role.MEMBER

    @extend_schema(responses=VolumeOut)
    def get(self, request: Request, workspace: str, name: str) -> Response:
        return Response(VolumeOut(volume_get(workspace_id=self.workspace.pk, name=name[:63])).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str, name: str) -> Response:
        volume_delete(volume=volume_get(workspace_id=self.workspace.pk, name=name[:63]))
        self.audit(AuditKind.BACKEND, "volume.deleted", name[:63])
        return Response(status=204)

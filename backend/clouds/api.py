"""Runners and instances of a workspace, for the dashboard."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.tenancy import WorkspaceAPIView
from backend.clouds.models import LIVE_STATUSES, Instance, InstanceStatus
from backend.runs.models import ACTIVE_JOB, Job


class CurrentJobOut(serializers.Serializer[Any]):
    run = serializers.CharField()
    job = serializers.UUIDField()
    job_name = serializers.CharField()


class InstanceOut(serializers.ModelSerializer[Instance]):
    current_job = serializers.SerializerMethodField()
    uptime_seconds = serializers.SerializerMethodField()

    class Meta:
        model = Instance
        fields = [
            "id",
            "name",
            "backend",
            "status",
            "status_reason",
            "hostname",
            "address",
            "cpus",
            "memory_bytes",
            "gpus",
            "current_job",
            "created_at",
            "last_heartbeat_at",
            "uptime_seconds",
        ]
        read_only_fields = fields

    @extend_schema_field(CurrentJobOut(allow_null=True))
    def get_current_job(self, instance: Instance) -> dict[str, Any] | None:
        job = self.context["current"].get(instance.pk)
        return {"run": job.run.name, "job": str(job.pk), "job_name": job.name} if job else None

    def get_uptime_seconds(self, instance: Instance) -> float:
        end = instance.terminated_at or timezone.now()
        return round((end - instance.created_at).total_seconds(), 1)


class InstanceListView(WorkspaceAPIView):
    @extend_schema(responses=InstanceOut(many=True), parameters=[OpenApiParameter("all", bool)])
    def get(self, request: Request, workspace: str) -> Response:
        instances = Instance.objects.for_workspace(self.workspace).order_by("-created_at")
        if request.query_params.get("all") not in {"1", "true"}:
            instances = instances.filter(status__in=[*LIVE_STATUSES, InstanceStatus.TERMINATING])
        shown = list(instances[:200])
        active = Job.objects.filter(instance__in=shown, status__in=ACTIVE_JOB).select_related("run")
        current = {job.instance_id: job for job in active}
        return Response(InstanceOut(shown, many=True, context={"current": current}).data)

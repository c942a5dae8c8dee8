"""A run's artifacts, as the dashboard and the CLI list them (``…/runs/<run>/artifacts/``).

The run is found by name or id within the URL's workspace (``run_get``);
its files are downloaded through the artifacts app's own endpoints
(``backend.artifacts.api``)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.tenancy import WorkspaceAPIView
from backend.artifacts.models import Artifact, ArtifactStatus
from backend.core.errors import NotFound
from backend.runs.selectors import run_get


class ArtifactFileOut(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()


class ArtifactOut(serializers.ModelSerializer):
    files = ArtifactFileOut(many=True)

    class Meta:
        model = Artifact
        fields = ["id", "job", "path", "status", "total_size", "files", "created_at"]
        read_only_fields = fields


class RunArtifactsView(WorkspaceAPIView):
    @extend_schema(responses=ArtifactOut(many=True))
    def get(self, request: Request, workspace: str, run: str) -> Response:
        found = run_get(workspace=self.workspace, ref=run)
        if found is None:
            raise NotFound(f"Run {run!r} not found.")
        artifacts = list(found.artifacts.prefetch_related("files").order_by("created_at", "path"))
        # A mounted artifact's next upload under way: its last complete one is what there is to see.
        complete = {(a.job_id, a.path) for a in artifacts if a.status == ArtifactStatus.COMPLETE}
        shown = [a for a in artifacts if a.status == ArtifactStatus.COMPLETE or (a.job_id, a.path) not in complete]
        return Response(ArtifactOut(shown, many=True).data)

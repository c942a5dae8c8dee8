"""A run's artifacts, as the dashboard and the CLI list them (``…/runs/<run>/artifacts/``),
and their copies to a workflow's ``to:`` (``…/runs/<run>/exports/``: a
reused job's too, whose artifacts stay with the run that made them).

The run is found by name or id within the URL's workspace (``run_get``);
its files are downloaded through the artifacts app's own endpoints
(``backend.artifacts.api``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.tenancy import WorkspaceAPIView
from backend.artifacts.models import Artifact, ArtifactExport, ArtifactStatus
from backend.core.errors import NotFound
from backend.runs.models import run_ref_missing
from backend.runs.selectors import run_get


class ArtifactFileOut(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()


class ExportOut(serializers.ModelSerializer):
    """One copy of an artifact to its ``to:``: pending, copying, done, or
    failed (``error``: the last attempt's reason, also while a retry waits)."""

    job_name = serializers.CharField(source="job.name")

    class Meta:
        model = ArtifactExport
        fields = [
            "id",
            "job",
            "job_name",
            "path",
            "artifact",
            "destination",
            "status",
            "attempts",
            "error",
            "next_attempt_at",
            "done_at",
            "objects_copied",
            "bytes_copied",
            "method",
        ]
        read_only_fields = fields


class ArtifactOut(serializers.ModelSerializer):
    files = ArtifactFileOut(many=True)
    export = serializers.SerializerMethodField()

    class Meta:
        model = Artifact
        fields = ["id", "job", "path", "status", "total_size", "files", "created_at", "export"]
        read_only_fields = fields

    @extend_schema_field(ExportOut(allow_null=True))
    def get_export(self, artifact: Artifact) -> dict[str, Any] | None:
        """The copy of this artifact to its job's ``to:``, or None (no ``to:``)."""
        found = self.context.get("exports", {}).get((artifact.job_id, artifact.path))
        return dict(ExportOut(found).data) if found is not None else None


class RunArtifactsView(WorkspaceAPIView):
    @extend_schema(responses=ArtifactOut(many=True))
    def get(self, request: Request, workspace: str, run: str) -> Response:
        found = run_get(workspace=self.workspace, ref=run)
        if found is None:
            raise NotFound(run_ref_missing(run))
        artifacts = list(found.artifacts.prefetch_related("files").order_by("created_at", "path"))
        # A mounted artifact's next upload under way: its last complete one is what there is to see.
        complete = {(a.job_id, a.path) for a in artifacts if a.status == ArtifactStatus.COMPLETE}
        shown = [a for a in artifacts if a.status == ArtifactStatus.COMPLETE or (a.job_id, a.path) not in complete]
        exports = {(e.job_id, e.path): e for e in found.exports.select_related("job")}
        return Response(ArtifactOut(shown, many=True, context={"exports": exports}).data)


class RunExportsView(WorkspaceAPIView):
    @extend_schema(responses=ExportOut(many=True))
    def get(self, request: Request, workspace: str, run: str) -> Response:
        found = run_get(workspace=self.workspace, ref=run)
        if found is None:
            raise NotFound(run_ref_missing(run))
        exports = found.exports.select_related("job").order_by("job__name", "path")
        return Response(ExportOut(exports, many=True).data)

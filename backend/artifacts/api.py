"""REST views for a workspace's artifacts: one file, or a zip of some or all
of an artifact's files. A run's list of artifacts and the runner's uploads are
runs' API (``backend.runs.api``), which calls this app's services; this app
imports nothing of runs but its models (contract ``artifacts-below-runs``)."""

from __future__ import annotations

from django.http import HttpResponseRedirect
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request

from backend.accounts.tenancy import WorkspaceAPIView
from backend.artifacts.archive import archive_url
from backend.artifacts.locations import storage_of
from backend.artifacts.models import Artifact, ArtifactStatus
from backend.artifacts.services import artifact_file_key, path_problem
from backend.core.errors import NotFound


class ArtifactFileView(WorkspaceAPIView):
    @extend_schema(responses={302: None})
    def get(self, request: Request, workspace: str, artifact: str, path: str) -> HttpResponseRedirect:
        found = (
            Artifact.objects.for_workspace(self.workspace).filter(pk=artifact, status=ArtifactStatus.COMPLETE).first()
        )
        file = found.files.filter(path=path).first() if found and not path_problem(path) else None
        if found is None or file is None:
            raise NotFound("Artifact file not found.")
        name = path.rsplit("/", 1)[-1]
        url = storage_of(found).signed_url(artifact_file_key(found, file), method="GET", seconds=300, filename=name)
        return HttpResponseRedirect(url)


class ArtifactArchiveView(WorkspaceAPIView):
    throttle_scopes = {"GET": "archive"}

    @extend_schema(responses={302: None}, parameters=[OpenApiParameter("prefix", str)])
    def get(self, request: Request, workspace: str, artifact: str) -> HttpResponseRedirect:
        found = (
            Artifact.objects.for_workspace(self.workspace).filter(pk=artifact, status=ArtifactStatus.COMPLETE).first()
        )
        if found is None:
            raise NotFound("Artifact not found.")
        prefix = request.query_params.get("prefix", "")
        if prefix and not found.files.filter(path__startswith=prefix).exists():
            raise NotFound(f"No files under {prefix!r} in this artifact.")
        return HttpResponseRedirect(archive_url(artifact=found, prefix=prefix))

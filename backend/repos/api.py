"""Connected repositories of a workspace, for the dashboard."""

from __future__ import annotations

from django.db.models import Count, Max
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.tenancy import WorkspaceAPIView
from backend.repos.models import Repo


class RepoOut(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    url = serializers.CharField()
    runs = serializers.IntegerField(source="run_count")
    last_run_at = serializers.DateTimeField(allow_null=True)


class RepoListView(WorkspaceAPIView):
    @extend_schema(responses=RepoOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        repos = (
            Repo.objects.for_workspace(self.workspace)
            .annotate(run_count=Count("runs"), last_run_at=Max("runs__created_at"))
            .order_by("-last_run_at", "name")
        )
        return Response(RepoOut(repos, many=True).data)

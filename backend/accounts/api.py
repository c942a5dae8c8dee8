from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.accounts.selectors import default_workspace, memberships_of


class WorkspaceRefOut(serializers.Serializer):
    slug = serializers.SlugField()
    name = serializers.CharField()
    role = serializers.ChoiceField(choices=["admin", "member", "viewer"])


class MeOut(serializers.Serializer):
    username = serializers.CharField()
    default_workspace = serializers.SlugField(allow_null=True)
    workspaces = WorkspaceRefOut(many=True)


class MeView(APIView):
    @extend_schema(responses=MeOut)
    def get(self, request: Request) -> Response:
        default = default_workspace(user=request.user)
        return Response(
            {
                "username": request.user.username,
                "default_workspace": default.slug if default else None,
                "workspaces": [
                    {"slug": m.workspace.slug, "name": m.workspace.name, "role": m.role}
                    for m in memberships_of(user=request.user)
                ],
            }
        )


class HealthView(APIView):
    authentication_classes: list[object] = []
    permission_classes = [AllowAny]

    @extend_schema(responses=inline_serializer("Health", {"status": serializers.CharField()}))
    def get(self, request: Request) -> Response:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return Response({"status": "ok"})

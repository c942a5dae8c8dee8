"""Connected repositories of a workspace, and their clone credentials
(set and removed here; never read back: only whether one is set, its kind
and when)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Max
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.auth import signed_in_user
from backend.accounts.models import AuditKind, Role
from backend.accounts.tenancy import WorkspaceAPIView
from backend.core.errors import ApplicationError, NotFound
from backend.core.urlcreds import url_without_credentials
from backend.repos.models import Repo
from backend.vault.models import CredentialKind, RepoCredential
from backend.vault.services import repo_credential_delete, repo_credential_set


class CredentialOut(serializers.Serializer[Any]):
    set = serializers.BooleanField()
    kind = serializers.CharField()
    set_at = serializers.DateTimeField()


class RepoOut(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    name = serializers.CharField()
    url = serializers.SerializerMethodField()
    runs = serializers.IntegerField(source="run_count")
    last_run_at = serializers.DateTimeField(allow_null=True)
    credential = serializers.SerializerMethodField()

    def get_url(self, repo: Repo) -> str:
        # A repo recorded before credentials were stripped at submission shows none either.
        return url_without_credentials(repo.url)

    @extend_schema_field(CredentialOut(allow_null=True))
    def get_credential(self, repo: Repo) -> dict[str, Any] | None:
        # The list passes every repo's credential in its context (one query, not one per repo).
        credentials = self.context.get("credentials")
        if credentials is not None:
            row = credentials.get(repo.pk)
        else:
            row = RepoCredential.objects.filter(repo_id=repo.pk).only("kind", "updated_at").first()
        return _credential_out(row) if row else None


class CredentialIn(serializers.Serializer[Any]):
    url = serializers.CharField(max_length=500)
    kind = serializers.ChoiceField(choices=CredentialKind.choices)
    # The token (https-token) or the private key (ssh-key); write-only.
    secret = serializers.CharField(max_length=16384, trim_whitespace=False, write_only=True)
    username = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)


class RepoListView(WorkspaceAPIView):
    @extend_schema(responses=RepoOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        repos = (
            Repo.objects.for_workspace(self.workspace)
            .annotate(run_count=Count("runs"), last_run_at=Max("runs__created_at"))
            .order_by("-last_run_at", "name")
        )
        rows = RepoCredential.objects.for_workspace(self.workspace).only("repo_id", "kind", "updated_at")
        credentials = {row.repo_id: row for row in rows}
        return Response(RepoOut(repos, many=True, context={"credentials": credentials}).data)


class RepoCredentialView(WorkspaceAPIView):
    """PUT sets (or replaces) a repo's clone credential; DELETE ?url= removes
    it. Admins only: the credential is handed to every job of the repo."""

    write_role = Role.ADMIN

    @extend_schema(request=CredentialIn, responses={200: CredentialOut})
    def put(self, request: Request, workspace: str) -> Response:
        data = CredentialIn(data=request.data)
        data.is_valid(raise_exception=True)
        row = repo_credential_set(
            workspace=self.workspace,
            user=signed_in_user(request),
            url=data.validated_data["url"],
            kind=data.validated_data["kind"],
            secret=data.validated_data["secret"],
            username=data.validated_data["username"],
        )
        self.audit(AuditKind.CREDENTIAL, "credential.set", row.repo.url, {"kind": row.kind})
        return Response(_credential_out(row))

    @extend_schema(parameters=[OpenApiParameter("url", str, required=True)], responses={204: None})
    def delete(self, request: Request, workspace: str) -> Response:
        url = request.query_params.get("url", "")
        if not url:
            raise ApplicationError("Say which repository: ?url=<its clone URL>.")
        if not repo_credential_delete(workspace=self.workspace, url=url):
            raise NotFound(f"No credential is set for {url} in this workspace.")
        self.audit(AuditKind.CREDENTIAL, "credential.deleted", url_without_credentials(url.strip()))
        return Response(status=204)


def _credential_out(row: RepoCredential) -> dict[str, Any]:
    return {"set": True, "kind": row.kind, "set_at": row.updated_at}

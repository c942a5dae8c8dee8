"""REST: grant a session into a running job, list sessions, end one (docs/ACCESS.md)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from backend.access.models import SessionKind
from backend.access.selectors import session_visible, sessions_visible
from backend.access.services.sessions import CLOSE_ENDED_BY_ADMIN, Grant, end_session, grant_session
from backend.accounts.auth import signed_in_user
from backend.accounts.models import Role
from backend.accounts.tenancy import WorkspaceAPIView
from backend.core.errors import NotFound
from backend.core.ratelimit import client_ip
from backend.runs.models import run_ref_missing
from backend.runs.selectors import run_get


class SessionIn(serializers.Serializer):
    job = serializers.CharField(max_length=200, required=False, allow_blank=True, help_text="the job's name")
    kind = serializers.ChoiceField(choices=SessionKind.choices)
    port = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=65535)
    client = serializers.CharField(max_length=100, required=False, allow_blank=True, help_text='e.g. "cli ssh"')


class GrantOut(serializers.Serializer):
    id = serializers.UUIDField()
    token = serializers.CharField(help_text="the client's credential (Authorization: Bearer), shown once")
    url = serializers.CharField(help_text="the client's websocket")
    expires_at = serializers.DateTimeField(help_text="the first connect must come before")
    run = serializers.CharField()
    job = serializers.CharField()
    attempt = serializers.IntegerField()
    kind = serializers.CharField()
    host_alias = serializers.CharField()
    host_key = serializers.CharField(help_text="the runner's SSH host key (kind ssh)")


class SessionOut(serializers.Serializer):
    id = serializers.UUIDField()
    user = serializers.CharField(source="user.username")
    run = serializers.CharField(source="job.run.name")
    job = serializers.CharField(source="job.name")
    attempt = serializers.IntegerField(source="attempt.number")
    kind = serializers.CharField()
    port = serializers.IntegerField(allow_null=True)
    state = serializers.CharField()
    client_address = serializers.CharField(allow_null=True)
    client_label = serializers.CharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    end_reason = serializers.CharField()
    bytes_up = serializers.IntegerField()
    bytes_down = serializers.IntegerField()
    last_activity_at = serializers.DateTimeField(allow_null=True)


class SessionGrantView(WorkspaceAPIView):
    """Members and admins; the job must be running on a runner that serves sessions."""

    @extend_schema(request=SessionIn, responses={201: GrantOut})
    def post(self, request: Request, workspace: str, run: str) -> Response:
        data = SessionIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        found = run_get(workspace=self.workspace, ref=run)
        if found is None:
            raise NotFound(run_ref_missing(run))
        grant = grant_session(
            workspace=self.workspace,
            user=signed_in_user(request),
            run=found,
            job_name=v.get("job") or None,
            kind=v["kind"],
            port=v.get("port"),
            client_address=client_ip(request),
            client_label=v.get("client") or "api",
        )
        return Response(GrantOut(_granted(grant)).data, status=status.HTTP_201_CREATED)


class SessionListView(WorkspaceAPIView):
    """Admins see every session of the workspace; others their own."""

    @extend_schema(
        responses=SessionOut(many=True),
        parameters=[OpenApiParameter("live", bool, description="only sessions not ended")],
    )
    def get(self, request: Request, workspace: str) -> Response:
        live = request.query_params.get("live", "") in ("1", "true")
        sessions = sessions_visible(
            workspace=self.workspace, user=signed_in_user(request), admin=self._admin(), live=live
        )
        return Response(SessionOut(sessions, many=True).data)

    def _admin(self) -> bool:
        return bool(self.membership.role == Role.ADMIN)


class SessionEndView(WorkspaceAPIView):
    """An admin ends any session of the workspace; a member their own."""

    @extend_schema(request=None, responses={200: SessionOut})
    def post(self, request: Request, workspace: str, session: str) -> Response:
        user = signed_in_user(request)
        admin = self.membership.role == Role.ADMIN
        found = session_visible(workspace=self.workspace, user=user, admin=admin, session_id=session)
        if found is None:
            raise NotFound(f"Session {session} not found.")
        by = "an admin" if admin and found.user_id != user.pk else "its user"
        end_session(found.pk, f"ended by {by} ({user.username})", code=CLOSE_ENDED_BY_ADMIN)
        found.refresh_from_db()
        return Response(SessionOut(found).data)


def _granted(grant: Grant) -> dict[str, object]:
    base = settings.PUBLIC_URL.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return {
        "id": grant.session.pk,
        "token": grant.token,
        "url": f"{base}/ws/v1/relay/{grant.session.pk}/",
        "expires_at": grant.expires_at,
        "run": grant.run,
        "job": grant.job,
        "attempt": grant.attempt,
        "kind": grant.session.kind,
        "host_alias": grant.host_alias,
        "host_key": grant.host_key,
    }

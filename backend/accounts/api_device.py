"""Browser sign-in for the CLI (RFC 8628's device authorization grant):
the device starts a request and polls with its device code; the signed-in
person looks the user code up on the dashboard and approves or denies it
(backend/accounts/services/device_login.py)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ParseError
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.accounts.auth import signed_in_user
from backend.accounts.models import AuditKind, DeviceLogin, User
from backend.accounts.services.audit import Actor, audit_record
from backend.accounts.services.device_login import (
    DeviceGrantError,
    device_login_decide,
    device_login_poll,
    device_login_start,
    display_user_code,
    pending_device_login,
)
from backend.core.errors import NotFound
from backend.core.ratelimit import client_ip

VERIFICATION_PATH = "/device"
NO_SUCH_CODE = (
    "No sign-in is waiting for this code: check it, or run `trainyard login` again (a code lasts a few minutes"
    " and is used once)."
)


class DeviceStartIn(serializers.Serializer):
    client_name = serializers.CharField(
        max_length=100, help_text="What is signing in, shown to the person who approves it (the token's name)."
    )


class DeviceStartOut(serializers.Serializer):
    device_code = serializers.CharField(help_text="The device's secret: it polls with it. Shown this once.")
    user_code = serializers.CharField(help_text="Typed on the dashboard: two groups of four letters, like BCDF-GHJK.")
    verification_uri = serializers.CharField(help_text="The dashboard page where the code is entered.")
    verification_uri_complete = serializers.CharField(help_text="That page with the code filled in.")
    expires_in = serializers.IntegerField(help_text="Seconds the code may be approved.")
    interval = serializers.IntegerField(help_text="Seconds to wait between polls.")


class DeviceTokenIn(serializers.Serializer):
    device_code = serializers.CharField(max_length=200)


class DeviceTokenOut(serializers.Serializer):
    token = serializers.CharField(help_text="A new API token of the person who approved: shown this once.")
    name = serializers.CharField(help_text="The token's name (the device's client_name).")
    username = serializers.CharField()
    expires_at = serializers.DateTimeField()


class DeviceGrantErrorOut(serializers.Serializer):
    error = serializers.ChoiceField(
        choices=[
            "authorization_pending",
            "slow_down",
            "access_denied",
            "expired_token",
            "invalid_grant",
            "invalid_request",
        ],
        help_text="RFC 8628's answer: wait, wait longer (interval), or stop; invalid_request: no usable device_code.",
    )
    message = serializers.CharField()
    interval = serializers.IntegerField(required=False, help_text="Seconds to wait before the next poll.")


class DeviceRequestOut(serializers.Serializer):
    user_code = serializers.CharField()
    client_name = serializers.CharField()
    address = serializers.CharField(allow_null=True, help_text="The address the request came from.")
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()


class DeviceDecisionOut(serializers.Serializer):
    user_code = serializers.CharField()
    client_name = serializers.CharField()
    state = serializers.ChoiceField(choices=["approved", "denied"])


class DeviceStartView(APIView):
    """Public: a device (``trainyard login``) asks to sign in."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    throttle_scopes = {"POST": "device"}

    @extend_schema(request=DeviceStartIn, responses={201: DeviceStartOut})
    def post(self, request: Request) -> Response:
        data = DeviceStartIn(data=request.data)
        data.is_valid(raise_exception=True)
        started = device_login_start(client_name=data.validated_data["client_name"], address=client_ip(request))
        page = settings.PUBLIC_URL + VERIFICATION_PATH
        return Response(
            {
                "device_code": started.device_code,
                "user_code": started.user_code,
                "verification_uri": page,
                "verification_uri_complete": f"{page}?code={started.user_code}",
                "expires_in": round((started.row.expires_at - started.row.created_at).total_seconds()),
                "interval": started.row.interval,
            },
            status=201,
        )


class DeviceTokenView(APIView):
    """Public: the device polls with its device code (400 with ``error`` until approved)."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    @extend_schema(
        request=DeviceTokenIn,
        responses={200: DeviceTokenOut, 400: OpenApiResponse(DeviceGrantErrorOut, description="Not (yet) a token.")},
    )
    def post(self, request: Request) -> Response:
        try:
            data = DeviceTokenIn(data=request.data)
        except ParseError as unreadable:
            return Response({"error": "invalid_request", "message": f"Invalid input: {unreadable.detail}"}, status=400)
        if not data.is_valid():
            fields = "; ".join(f"{name}: {' '.join(map(str, errors))}" for name, errors in data.errors.items())
            return Response({"error": "invalid_request", "message": f"Invalid input: {fields}"}, status=400)
        try:
            issued = device_login_poll(device_code=data.validated_data["device_code"])
        except DeviceGrantError as refused:
            body: dict[str, Any] = {"error": refused.error, "message": refused.message}
            if refused.interval is not None:
                body["interval"] = refused.interval
            return Response(body, status=400)
        user = issued.row.user
        _audit(request, user, "token.device_created", issued.row.name, {"token": str(issued.row.pk)})
        return Response(
            {
                "token": issued.token,
                "name": issued.row.name,
                "username": user.username,
                "expires_at": issued.row.expires_at,
            }
        )


class DeviceRequestView(APIView):
    """The signed-in person looks a user code up: what asks to sign in as them."""

    throttle_scopes = {"GET": "device"}

    @extend_schema(responses=DeviceRequestOut)
    def get(self, request: Request, user_code: str) -> Response:
        signed_in_user(request)
        row = pending_device_login(user_code=user_code)
        if row is None:
            raise NotFound(NO_SUCH_CODE)
        return Response(DeviceRequestOut(_request_of(row)).data)


class DeviceApproveView(APIView):
    """The signed-in person approves the code: the device's next poll gets a token of theirs."""

    throttle_scopes = {"POST": "device"}
    approve = True

    @extend_schema(request=None, responses=DeviceDecisionOut)
    def post(self, request: Request, user_code: str) -> Response:
        user = signed_in_user(request)
        row = device_login_decide(user_code=user_code, user=user, approve=self.approve)
        if row is None:
            raise NotFound(NO_SUCH_CODE)
        verb = "device_approved" if self.approve else "device_denied"
        _audit(request, user, f"token.{verb}", row.client_name, {"user_code": display_user_code(row.user_code)})
        return Response(
            {"user_code": display_user_code(row.user_code), "client_name": row.client_name, "state": row.state}
        )


class DeviceDenyView(DeviceApproveView):
    """The signed-in person denies the code: the device is told so."""

    approve = False


def _request_of(row: DeviceLogin) -> dict[str, Any]:
    return {
        "user_code": display_user_code(row.user_code),
        "client_name": row.client_name,
        "address": row.address,
        "created_at": row.created_at,
        "expires_at": row.expires_at,
    }


def _audit(request: Request, user: User, action: str, target: str, detail: dict[str, Any]) -> None:
    """A token is a person's: its events go to the audit log of their personal workspace (if any)."""
    personal = getattr(user, "personal_workspace", None)
    if personal is None:
        return
    audit_record(
        workspace_id=personal.pk,
        kind=AuditKind.TOKEN,
        action=action,
        actor=Actor(user=user, address=client_ip(request)),
        target=target,
        detail=detail,
    )

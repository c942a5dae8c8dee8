"""Self-hosted runners of a workspace: registration tokens (shown once), the
registered machines, their price per hour, revoking one; and the runner's
own registration call."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.accounts.auth import signed_in_user
from backend.accounts.models import AuditKind, Role
from backend.accounts.services.audit import Actor, audit_record
from backend.accounts.tenancy import WorkspaceAPIView
from backend.clouds.models import Instance, InstanceReason, RunnerRegistrationToken
from backend.clouds.services.selfhosted import (
    registration_token_create,
    registration_token_list,
    registration_token_revoke,
    registration_token_state,
    runner_price_set,
    runner_register,
    runner_revoke,
    runners_list,
)
from backend.core.errors import NotFound
from backend.core.ratelimit import client_ip


class RegistrationTokenIn(serializers.Serializer[Any]):
    note = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
    # USD an hour for the machine it registers, "1.20" (services.selfhosted.price_clean checks it).
    price_per_hour = serializers.CharField(max_length=40, required=False, allow_null=True, default=None)


class RunnerChangeIn(serializers.Serializer[Any]):
    price_per_hour = serializers.CharField(max_length=40)  # USD an hour, "1.20"; "0": free


class RegistrationTokenOut(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    prefix = serializers.CharField()
    note = serializers.CharField()
    state = serializers.SerializerMethodField()  # unused, used, revoked, expired
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    used_at = serializers.DateTimeField(allow_null=True)
    price_per_hour = serializers.DecimalField(max_digits=12, decimal_places=6)
    runner = serializers.SerializerMethodField()

    def get_state(self, row: RunnerRegistrationToken) -> str:
        return registration_token_state(row)

    def get_runner(self, row: RunnerRegistrationToken) -> str | None:
        return str(row.instance_id) if row.instance_id else None


class RegistrationTokenCreatedOut(RegistrationTokenOut):
    token = serializers.CharField()  # this answer only


class SelfHostedRunnerOut(serializers.ModelSerializer[Instance]):
    revoked = serializers.SerializerMethodField()

    class Meta:
        model = Instance
        fields = [
            "id",
            "name",
            "status",
            "status_reason",
            "revoked",
            "hostname",
            "address",
            "runner_version",
            "cpus",
            "memory_bytes",
            "disk_bytes",
            "gpus",
            "price_per_hour",
            "price_source",
            "created_at",
            "connected_at",
            "last_heartbeat_at",
        ]
        read_only_fields = fields

    def get_revoked(self, instance: Instance) -> bool:
        return instance.termination_reason == InstanceReason.REVOKED


class RegistrationTokenListView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(responses=RegistrationTokenOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        rows = registration_token_list(workspace=self.workspace)
        return Response(RegistrationTokenOut(rows, many=True).data)

    @extend_schema(request=RegistrationTokenIn, responses={201: RegistrationTokenCreatedOut})
    def post(self, request: Request, workspace: str) -> Response:
        data = RegistrationTokenIn(data=request.data)
        data.is_valid(raise_exception=True)
        issued = registration_token_create(
            workspace=self.workspace,
            user=signed_in_user(request),
            note=data.validated_data["note"],
            price_per_hour=data.validated_data["price_per_hour"],
        )
        out = {**RegistrationTokenOut(issued.row).data, "token": issued.token}
        detail = {"note": issued.row.note, "price_per_hour": str(issued.row.price_per_hour)}
        self.audit(AuditKind.TOKEN, "token.registration_created", str(issued.row.pk), detail)
        return Response(out, status=201)


class RegistrationTokenDetailView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str, token: UUID) -> Response:
        if not registration_token_revoke(workspace=self.workspace, token_id=token):
            raise NotFound("No such registration token in this workspace.")
        self.audit(AuditKind.TOKEN, "token.registration_revoked", str(token))
        return Response(status=204)


class SelfHostedRunnerListView(WorkspaceAPIView):
    @extend_schema(responses=SelfHostedRunnerOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        return Response(SelfHostedRunnerOut(runners_list(workspace=self.workspace), many=True).data)


class SelfHostedRunnerView(WorkspaceAPIView):
    """One self-hosted machine: admins set its price per hour (audited)."""

    write_role = Role.ADMIN

    @extend_schema(request=RunnerChangeIn, responses=SelfHostedRunnerOut)
    def patch(self, request: Request, workspace: str, runner: UUID) -> Response:
        data = RunnerChangeIn(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():  # the price and its audit entry together
            changed = runner_price_set(
                workspace=self.workspace, instance_id=runner, price_per_hour=data.validated_data["price_per_hour"]
            )
            if changed is None:
                raise NotFound("No such self-hosted runner in this workspace.")
            instance = changed.instance
            detail = {"from": str(changed.before), "to": str(instance.price_per_hour)}
            self.audit(AuditKind.RUNNER, "runner.price_set", instance.name, detail)
        return Response(SelfHostedRunnerOut(instance).data)


class SelfHostedRunnerRevokeView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Request, workspace: str, runner: UUID) -> Response:
        if not runner_revoke(workspace=self.workspace, instance_id=runner):
            raise NotFound("No such self-hosted runner in this workspace.")
        self.audit(AuditKind.RUNNER, "runner.revoked", str(runner))
        return Response(status=204)


# ------------------------------------------------------------- runner side


class RegisterIn(serializers.Serializer[Any]):
    token = serializers.CharField(max_length=200)
    name = serializers.CharField(max_length=63, required=False, default="", allow_blank=True)
    hostname = serializers.CharField(max_length=255, required=False, default="", allow_blank=True)


class RegisterOut(serializers.Serializer[Any]):
    runner = serializers.UUIDField()
    name = serializers.CharField()
    workspace = serializers.CharField()
    runner_token = serializers.CharField()  # this answer only


class RunnerRegisterView(APIView):
    """``trainyard-runner register``: authenticated by the registration token in the body."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    @extend_schema(request=RegisterIn, responses={201: RegisterOut})
    def post(self, request: Request) -> Response:
        data = RegisterIn(data=request.data)
        data.is_valid(raise_exception=True)
        registered = runner_register(
            token=data.validated_data["token"],
            name=data.validated_data["name"],
            hostname=data.validated_data["hostname"],
        )
        instance = registered.instance
        audit_record(
            workspace_id=instance.workspace_id,
            kind=AuditKind.RUNNER,
            action="runner.registered",
            actor=Actor(runner=instance.name, address=client_ip(request)),
            target=instance.name,
            detail={"hostname": data.validated_data["hostname"][:255]},
        )
        out = {
            "runner": str(instance.pk),
            "name": instance.name,
            "workspace": instance.workspace.slug,
            "runner_token": registered.runner_token,
        }
        return Response(RegisterOut(out).data, status=201)

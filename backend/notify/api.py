"""A workspace's notification subscriptions (docs/API.md): admins make and
manage the workspace's; a member makes and manages their own (events of
the runs they submitted). A webhook's secret is in the answer to its
creation and nowhere else."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.auth import signed_in_user
from backend.accounts.models import AuditKind, Role
from backend.accounts.tenancy import WorkspaceAPIView
from backend.core.errors import ApplicationError, NotFound
from backend.notify.models import EVENTS, Delivery, Kind, Scope, Subscription
from backend.notify.selectors import deliveries_of, subscriptions_visible
from backend.notify.services import (
    subscription_create,
    subscription_delete,
    subscription_test,
    subscription_update,
)


class SubscriptionOut(serializers.ModelSerializer[Subscription]):
    created_by = serializers.CharField(source="created_by.username", default="", read_only=True)

    class Meta:
        model = Subscription
        fields = [
            "id",
            "kind",
            "scope",
            "target",
            "events",
            "enabled",
            "failing_since",
            "disabled_reason",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class SubscriptionCreatedOut(SubscriptionOut):
    secret = serializers.SerializerMethodField()

    class Meta(SubscriptionOut.Meta):
        fields = [*SubscriptionOut.Meta.fields, "secret"]
        read_only_fields = fields

    def get_secret(self, subscription: Subscription) -> str:
        return str(self.context.get("secret", ""))


class SubscriptionIn(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=Kind.choices)
    target = serializers.CharField(max_length=500)
    events = serializers.ListField(child=serializers.ChoiceField(choices=EVENTS), min_length=1, max_length=20)
    scope = serializers.ChoiceField(choices=Scope.choices, required=False)


class SubscriptionChangeIn(serializers.Serializer[Any]):
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=EVENTS), min_length=1, max_length=20, required=False
    )
    enabled = serializers.BooleanField(required=False)


class DeliveryOut(serializers.ModelSerializer[Delivery]):
    class Meta:
        model = Delivery
        fields = [
            "id",
            "event_id",
            "event_type",
            "status",
            "attempts",
            "last_status_code",
            "last_error",
            "next_at",
            "delivered_at",
            "created_at",
        ]
        read_only_fields = fields


class NotificationsView(WorkspaceAPIView):
    @extend_schema(responses=SubscriptionOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        subscriptions = subscriptions_visible(workspace=self.workspace, membership=self.membership)
        return Response(SubscriptionOut(subscriptions.select_related("created_by"), many=True).data)

    @extend_schema(request=SubscriptionIn, responses={201: SubscriptionCreatedOut})
    def post(self, request: Request, workspace: str) -> Response:
        data = SubscriptionIn(data=request.data)
        data.is_valid(raise_exception=True)
        admin = self.membership.role == Role.ADMIN
        scope = data.validated_data.get("scope") or (Scope.WORKSPACE if admin else Scope.MINE)
        if scope == Scope.WORKSPACE and not admin:
            raise ApplicationError(
                f"Your role in {self.workspace.slug} is {self.membership.role}: only admins subscribe for the "
                'whole workspace; subscribe for your own runs with scope "mine".',
                status_code=403,
            )
        created = subscription_create(
            workspace=self.workspace,
            user=signed_in_user(request),
            kind=data.validated_data["kind"],
            target=data.validated_data["target"],
            events=data.validated_data["events"],
            scope=scope,
        )
        subscription = created.subscription
        self.audit(AuditKind.WORKSPACE, "workspace.notification_added", f"{subscription.kind} {subscription.target}")
        out = SubscriptionCreatedOut(subscription, context={"secret": created.secret})
        return Response(out.data, status=201)


class _OneSubscription(WorkspaceAPIView):
    def subscription(self, pk: str) -> Subscription:
        found = subscriptions_visible(workspace=self.workspace, membership=self.membership).filter(pk=pk).first()
        if found is None:
            raise NotFound(f"notification {pk} not found in {self.workspace.slug}")
        return found


class NotificationView(_OneSubscription):
    @extend_schema(responses=SubscriptionOut)
    def get(self, request: Request, workspace: str, pk: str) -> Response:
        return Response(SubscriptionOut(self.subscription(pk)).data)

    @extend_schema(request=SubscriptionChangeIn, responses=SubscriptionOut)
    def patch(self, request: Request, workspace: str, pk: str) -> Response:
        subscription = self.subscription(pk)
        data = SubscriptionChangeIn(data=request.data)
        data.is_valid(raise_exception=True)
        subscription = subscription_update(subscription=subscription, **data.validated_data)
        self.audit(AuditKind.WORKSPACE, "workspace.notification_changed", f"{subscription.kind} {subscription.target}")
        return Response(SubscriptionOut(subscription).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str, pk: str) -> Response:
        subscription = self.subscription(pk)
        target = f"{subscription.kind} {subscription.target}"
        subscription_delete(subscription=subscription)
        self.audit(AuditKind.WORKSPACE, "workspace.notification_removed", target)
        return Response(status=204)


class NotificationTestView(_OneSubscription):
    @extend_schema(request=None, responses={202: DeliveryOut})
    def post(self, request: Request, workspace: str, pk: str) -> Response:
        delivery = subscription_test(subscription=self.subscription(pk))
        return Response(DeliveryOut(delivery).data, status=202)


class NotificationDeliveriesView(_OneSubscription):
    @extend_schema(responses=DeliveryOut(many=True))
    def get(self, request: Request, workspace: str, pk: str) -> Response:
        return Response(DeliveryOut(deliveries_of(subscription=self.subscription(pk)), many=True).data)

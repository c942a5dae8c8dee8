"""Instances, backends (connected cloud accounts) and offers of a workspace.

Serializers never include credentials: an account's keys (or kubeconfig)
go in through ``BackendCreateIn`` and never come out (``BackendOut`` lists
what it shows).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.db.models import Count
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.auth import signed_in_user
from backend.accounts.models import AuditKind, Role
from backend.accounts.tenancy import WorkspaceAPIView
from backend.billing.rules import billed_machine, machine_cost, machine_seconds
from backend.clouds.models import LIVE_STATUSES, BackendKind, CloudAccount, Instance, InstanceStatus
from backend.clouds.services.connections import (
    KUBERNETES_KEYS,
    MAX_KUBECONFIG_BYTES,
    aws_connect,
    aws_setup,
    backend_remove,
    backend_validate,
    kubernetes_connect,
)
from backend.clouds.services.instances import instance_terminate_named
from backend.clouds.services.offers import Candidate, catalog_date, offer_requirements, offers_rank
from backend.core.errors import NotFound
from backend.runs.models import ACTIVE_JOB, Job


class CurrentJobOut(serializers.Serializer[Any]):
    run = serializers.CharField()
    job = serializers.UUIDField()
    job_name = serializers.CharField()


class InstanceOut(serializers.ModelSerializer[Instance]):
    account = serializers.SerializerMethodField()
    price_per_hour = serializers.FloatField(help_text="USD an hour: compute and the root volume's storage")
    storage_price_per_hour = serializers.FloatField(
        help_text="USD an hour: the root volume's storage (part of price_per_hour; 0 where none is billed)"
    )
    current_job = serializers.SerializerMethodField()
    uptime_seconds = serializers.SerializerMethodField()
    billed_seconds = serializers.SerializerMethodField(
        help_text="from its first hello to its termination (else now), whole seconds, at least 60 (docs/COST.md)"
    )
    cost = serializers.SerializerMethodField(
        help_text="USD, a decimal string: price x billed seconds (its attempts' shares and its idle time)"
    )

    class Meta:
        model = Instance
        fields = [
            "id",
            "name",
            "backend",
            "account",
            "backend_id",
            "instance_type",
            "region",
            "zone",
            "spot",
            "price_per_hour",
            "storage_price_per_hour",
            "price_source",
            "market",
            "running_at",
            "terminated_at",
            "billed_seconds",
            "cost",
            "status",
            "status_reason",
            "hostname",
            "address",
            "cpus",
            "memory_bytes",
            "gpus",
            "current_job",
            "created_at",
            "last_heartbeat_at",
            "uptime_seconds",
            "cloud_state",
            "cloud_checked_at",
        ]
        read_only_fields = fields

    @extend_schema_field(CurrentJobOut(allow_null=True))
    def get_current_job(self, instance: Instance) -> dict[str, Any] | None:
        job = self.context["current"].get(instance.pk)
        return {"run": job.run.name, "job": str(job.pk), "job_name": job.name} if job else None

    def get_account(self, instance: Instance) -> str | None:
        """The name of the backend (cloud account) it runs in."""
        return instance.account.name if instance.account else None

    def get_billed_seconds(self, instance: Instance) -> int:
        return machine_seconds(billed_machine(instance), self._now())

    def get_cost(self, instance: Instance) -> str:
        return str(machine_cost(billed_machine(instance), self._now()))

    def _now(self) -> datetime:
        """The view's one "now" (all rows accrue to the same moment)."""
        return cast(datetime, self.context.get("now") or timezone.now())

    def get_uptime_seconds(self, instance: Instance) -> float:
        end = instance.terminated_at or timezone.now()
        return round((end - instance.created_at).total_seconds(), 1)


class InstanceListView(WorkspaceAPIView):
    @extend_schema(responses=InstanceOut(many=True), parameters=[OpenApiParameter("all", bool)])
    def get(self, request: Request, workspace: str) -> Response:
        instances = Instance.objects.for_workspace(self.workspace).select_related("account").order_by("-created_at")
        if request.query_params.get("all") not in {"1", "true"}:
            instances = instances.filter(status__in=[*LIVE_STATUSES, InstanceStatus.TERMINATING])
        shown = list(instances[:200])
        active = Job.objects.filter(instance__in=shown, status__in=ACTIVE_JOB).select_related("run")
        current = {job.instance_id: job for job in active}
        context = {"current": current, "now": timezone.now()}
        return Response(InstanceOut(shown, many=True, context=context).data)


class InstanceTerminateView(WorkspaceAPIView):
    """An admin ends one of the workspace's machines (audited)."""

    write_role = Role.ADMIN

    @extend_schema(request=None, responses={202: InstanceOut})
    def post(self, request: Request, workspace: str, name: str) -> Response:
        by = signed_in_user(request).username
        instance, asked = instance_terminate_named(workspace=self.workspace, name=name, by=by)
        if asked:
            self.audit(AuditKind.BACKEND, "instance.terminated", name, {"backend": instance.backend})
        active = Job.objects.filter(instance=instance, status__in=ACTIVE_JOB).select_related("run").first()
        context = {"current": {instance.pk: active} if active else {}, "now": timezone.now()}
        return Response(InstanceOut(instance, context=context).data, status=202)


# ------------------------------------------------------------------ backends


class TolerationSerializer(serializers.Serializer[Any]):
    """A pod toleration, as Kubernetes spells it."""

    key = serializers.CharField(required=False, allow_blank=True, max_length=317)
    operator = serializers.ChoiceField(choices=["Exists", "Equal"], required=False)
    value = serializers.CharField(required=False, allow_blank=True, max_length=63)
    effect = serializers.ChoiceField(
        choices=["", "NoSchedule", "PreferNoSchedule", "NoExecute"], required=False, allow_blank=True
    )
    tolerationSeconds = serializers.IntegerField(required=False, min_value=0, max_value=10**9)


def _labels_field(**kwargs: Any) -> serializers.DictField:
    """Node labels: label name → value (bounded)."""
    return serializers.DictField(child=serializers.CharField(max_length=63, allow_blank=True), **kwargs)


def _prices_field(**kwargs: Any) -> serializers.DictField:
    """Instance type → USD per hour."""
    return serializers.DictField(child=serializers.FloatField(min_value=0, max_value=10**6), **kwargs)


class NodePoolSerializer(serializers.Serializer[Any]):
    """A node pool an autoscaler grows from zero: offered although no node of it exists yet."""

    name = serializers.CharField(max_length=63)
    instance_type = serializers.CharField(max_length=100)
    cpus = serializers.IntegerField(min_value=1, max_value=10_000)
    memory_gib = serializers.FloatField(min_value=0.1, max_value=100_000)
    gpus = serializers.IntegerField(min_value=0, max_value=64, default=0)
    gpu_name = serializers.CharField(max_length=100, allow_blank=True, default="")
    gpu_memory_gib = serializers.FloatField(min_value=0, max_value=10_000, default=0)
    spot = serializers.BooleanField(default=False)
    price = serializers.FloatField(min_value=0, max_value=10**6, required=False, allow_null=True)
    node_selector = _labels_field(required=False)
    tolerations = TolerationSerializer(many=True, required=False)


class KubernetesOut(serializers.Serializer[Any]):
    """A Kubernetes backend's public configuration (never its kubeconfig)."""

    namespace = serializers.CharField()
    # Named as Serializer.context: DRF moves declared fields off the class; mypy cannot know.
    context = serializers.CharField(  # type: ignore[assignment]
        help_text='the kubeconfig\'s context used ("": its current-context)'
    )
    cluster = serializers.CharField(help_text="the offers' region (\"\": the context's cluster name)")
    in_cluster = serializers.BooleanField(help_text="the server's own service account, not a kubeconfig")
    image = serializers.CharField(help_text='"": the backend\'s default (python:3.12-slim)')
    image_pull_secrets = serializers.ListField(child=serializers.CharField())
    node_selector = serializers.DictField(child=serializers.CharField())
    tolerations = TolerationSerializer(many=True)
    prices = serializers.DictField(child=serializers.FloatField())
    spot_prices = serializers.DictField(child=serializers.FloatField(), allow_null=True)
    default_price = serializers.FloatField(allow_null=True)
    node_pools = NodePoolSerializer(many=True)
    schedule_timeout_seconds = serializers.FloatField(allow_null=True)
    termination_grace_seconds = serializers.IntegerField(allow_null=True)
    gpu_resource = serializers.CharField()
    nodes = serializers.IntegerField(help_text="nodes the last facts refresh listed")
    facts_refreshed_at = serializers.DateTimeField(allow_null=True)


class BackendOut(serializers.ModelSerializer[CloudAccount]):
    """An account as shown: its configuration's public part, never credentials."""

    auth = serializers.SerializerMethodField()
    regions = serializers.SerializerMethodField()
    bucket = serializers.SerializerMethodField()
    role_arn = serializers.SerializerMethodField()
    external_id = serializers.SerializerMethodField()
    aws_account_id = serializers.SerializerMethodField()
    kubernetes = serializers.SerializerMethodField()
    live_instances = serializers.SerializerMethodField()

    class Meta:
        model = CloudAccount
        fields = [
            "id",
            "name",
            "kind",
            "status",
            "status_reason",
            "validated_at",
            "created_at",
            "auth",
            "regions",
            "bucket",
            "role_arn",
            "external_id",
            "aws_account_id",
            "kubernetes",
            "live_instances",
        ]
        read_only_fields = fields

    def get_auth(self, account: CloudAccount) -> str:
        """ "role", "keys" (AWS), "kubeconfig", "in-cluster" (Kubernetes), or "" for backends without credentials."""
        if account.kind == BackendKind.KUBERNETES:
            return "in-cluster" if account.config.get("in_cluster") else "kubeconfig"
        if account.config.get("role_arn"):
            return "role"
        return "keys" if account.credentials_ciphertext else ""

    def get_regions(self, account: CloudAccount) -> list[str]:
        """AWS: its regions; Kubernetes: its cluster (the region its offers name)."""
        if account.kind == BackendKind.KUBERNETES:
            return [cluster] if (cluster := _kube_cluster(account)) else []
        return [str(r) for r in account.config.get("regions", [])]

    def get_bucket(self, account: CloudAccount) -> str:
        return str(account.config.get("bucket", ""))

    def get_role_arn(self, account: CloudAccount) -> str:
        return str(account.config.get("role_arn", ""))

    def get_external_id(self, account: CloudAccount) -> str:
        return str(account.config.get("external_id", ""))

    def get_aws_account_id(self, account: CloudAccount) -> str:
        return str(account.config.get("aws_account_id", ""))

    @extend_schema_field(KubernetesOut(allow_null=True))
    def get_kubernetes(self, account: CloudAccount) -> dict[str, Any] | None:
        """A Kubernetes backend's configuration as set (null for other kinds)."""
        if account.kind != BackendKind.KUBERNETES:
            return None
        config = account.config
        facts = config.get("facts") if isinstance(config.get("facts"), dict) else {}
        refreshed = facts.get("refreshed_at")
        return {
            "namespace": str(config.get("namespace", "")),
            "context": str(config.get("context", "")),
            "cluster": _kube_cluster(account),
            "in_cluster": bool(config.get("in_cluster")),
            "image": str(config.get("image", "")),
            "image_pull_secrets": list(config.get("image_pull_secrets") or []),
            "node_selector": dict(config.get("node_selector") or {}),
            "tolerations": list(config.get("tolerations") or []),
            "prices": dict(config.get("prices") or {}),
            "spot_prices": config.get("spot_prices"),
            "default_price": config.get("default_price"),
            "node_pools": list(config.get("node_pools") or []),
            "schedule_timeout_seconds": config.get("schedule_timeout_seconds"),
            "termination_grace_seconds": config.get("termination_grace_seconds"),
            "gpu_resource": str(config.get("gpu_resource", "")),
            "nodes": len(facts.get("nodes") or []),
            "facts_refreshed_at": _from_timestamp(refreshed),
        }

    def get_live_instances(self, account: CloudAccount) -> int:
        return int(self.context.get("live", {}).get(account.pk, 0))


def _kube_cluster(account: CloudAccount) -> str:
    """The cluster's name, as its offers give it as their region (recorded at connect)."""
    return str(account.config.get("cluster") or "")


def _from_timestamp(value: object) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, tz=timezone.get_current_timezone())
    return None


AWS_REQUIRED = ("regions", "bucket")
KUBERNETES_FIELDS = ("kubeconfig", *KUBERNETES_KEYS)
AWS_FIELDS = ("role_arn", "access_key_id", "secret_access_key", "regions", "bucket", "subnets", "amis", "gpu_amis")


class BackendCreateIn(serializers.Serializer[Any]):
    """One backend to connect: ``kind`` says which fields apply (AWS: a role
    or keys, regions, a bucket; Kubernetes: a kubeconfig or in_cluster, a
    namespace, and how its pods are placed and priced)."""

    kind = serializers.ChoiceField(choices=["aws", "kubernetes"])
    name = serializers.CharField(required=False, max_length=63, help_text="default: the kind")
    role_arn = serializers.CharField(required=False, allow_blank=True, max_length=2048)
    access_key_id = serializers.CharField(required=False, allow_blank=True, max_length=128)
    secret_access_key = serializers.CharField(
        required=False, allow_blank=True, max_length=256, write_only=True, trim_whitespace=False
    )
    regions = serializers.ListField(child=serializers.CharField(max_length=32), max_length=30, required=False)
    bucket = serializers.CharField(max_length=63, required=False)
    subnets = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField(max_length=40), max_length=20), required=False
    )
    amis = serializers.DictField(child=serializers.CharField(max_length=40), required=False)
    gpu_amis = serializers.DictField(child=serializers.CharField(max_length=40), required=False)
    kubeconfig = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=MAX_KUBECONFIG_BYTES,
        write_only=True,
        trim_whitespace=False,
        help_text="kubernetes: the kubeconfig's YAML (credentials inline); encrypted at rest, never returned",
    )
    in_cluster = serializers.BooleanField(
        required=False, default=False, help_text="kubernetes: the server's own service account, where allowed"
    )
    namespace = serializers.CharField(required=False, max_length=63)
    context = serializers.CharField(required=False, allow_blank=True, max_length=253)  # type: ignore[assignment]
    cluster = serializers.CharField(required=False, allow_blank=True, max_length=63)
    image = serializers.CharField(required=False, allow_blank=True, max_length=500)
    image_pull_secrets = serializers.ListField(
        child=serializers.CharField(max_length=253), max_length=20, required=False
    )
    node_selector = _labels_field(required=False)
    tolerations = TolerationSerializer(many=True, required=False)
    prices = _prices_field(required=False)
    spot_prices = _prices_field(required=False)
    default_price = serializers.FloatField(min_value=0, max_value=10**6, required=False)
    node_pools = NodePoolSerializer(many=True, required=False)
    schedule_timeout_seconds = serializers.FloatField(min_value=0, max_value=86_400, required=False)
    termination_grace_seconds = serializers.IntegerField(min_value=0, max_value=3600, required=False)
    gpu_resource = serializers.CharField(required=False, allow_blank=True, max_length=253)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """The fields of the other kind are refused, the kind's required ones named."""
        kind = attrs["kind"]
        own, other = (AWS_FIELDS, KUBERNETES_FIELDS) if kind == "aws" else (KUBERNETES_FIELDS, AWS_FIELDS)
        stray = [f for f in other if f in self.initial_data and f not in own]
        if stray:
            raise serializers.ValidationError({stray[0]: [f"not a field of {kind} backends"]})
        required = AWS_REQUIRED if kind == "aws" else ("namespace",)
        missing = [f for f in required if f not in attrs]
        if missing:
            raise serializers.ValidationError({f: ["This field is required."] for f in missing})
        return attrs


class AwsSetupOut(serializers.Serializer[Any]):
    external_id = serializers.CharField()
    principal = serializers.CharField()
    installation = serializers.CharField()
    prefix = serializers.CharField()
    trust_policy = serializers.JSONField()
    permission_policy = serializers.JSONField()


def _backends_out(accounts: list[CloudAccount]) -> Any:
    live = dict(
        Instance.objects.filter(account__in=accounts, status__in=[*LIVE_STATUSES, InstanceStatus.TERMINATING])
        .values("account")
        .annotate(n=Count("id"))
        .values_list("account", "n")
    )
    return BackendOut(accounts, many=True, context={"live": live}).data


class BackendListView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(responses=BackendOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        accounts = list(CloudAccount.objects.for_workspace(self.workspace).order_by("created_at"))
        return Response(_backends_out(accounts))

    @extend_schema(request=BackendCreateIn, responses={201: BackendOut})
    def post(self, request: Request, workspace: str) -> Response:
        data = BackendCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        kind = values.pop("kind")
        values.setdefault("name", kind)
        user = signed_in_user(request)
        if kind == BackendKind.KUBERNETES:
            account = kubernetes_connect(workspace=self.workspace, user=user, **values)
        else:
            values.pop("in_cluster", None)
            account = aws_connect(workspace=self.workspace, user=user, **values)
        self.audit(AuditKind.BACKEND, "backend.added", account.name, {"kind": account.kind})
        return Response(_backends_out([account])[0], status=201)


# The setup's query: the artifact bucket, and the named buckets of inputs: and to:.
SETUP_BUCKETS = ("bucket", "data_bucket", "output_bucket")


class AwsSetupView(WorkspaceAPIView):
    @extend_schema(
        responses=AwsSetupOut,
        parameters=[
            OpenApiParameter("bucket", str),
            OpenApiParameter("data_bucket", str, description="the bucket (or pattern) of `inputs:` to read"),
            OpenApiParameter("output_bucket", str, description="the bucket (or pattern) artifacts' `to:` write"),
        ],
    )
    def get(self, request: Request, workspace: str) -> Response:
        bucket, data, output = (request.query_params.get(k, "").strip()[:63] for k in SETUP_BUCKETS)
        setup = aws_setup(workspace=self.workspace, bucket=bucket, data_bucket=data, output_bucket=output)
        return Response(AwsSetupOut(setup).data)


class BackendDetailView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(responses=BackendOut)
    def get(self, request: Request, workspace: str, name: str) -> Response:
        return Response(_backends_out([_account(self.workspace, name)])[0])

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str, name: str) -> Response:
        backend_remove(account=_account(self.workspace, name))
        self.audit(AuditKind.BACKEND, "backend.removed", name)
        return Response(status=204)


class BackendValidateView(WorkspaceAPIView):
    write_role = Role.ADMIN

    @extend_schema(request=None, responses=BackendOut)
    def post(self, request: Request, workspace: str, name: str) -> Response:
        account = backend_validate(account=_account(self.workspace, name))
        return Response(_backends_out([account])[0])


def _account(workspace: Any, name: str) -> CloudAccount:
    account: CloudAccount | None = CloudAccount.objects.for_workspace(workspace).filter(name=name).first()
    if account is None:
        raise NotFound(f"Backend {name!r} not found.")
    return account


# ------------------------------------------------------------------ offers


class GpuOut(serializers.Serializer[Any]):
    name = serializers.CharField()
    memory_bytes = serializers.IntegerField()


class OfferOut(serializers.Serializer[Any]):
    offer_id = serializers.CharField()
    backend = serializers.CharField()
    account = serializers.CharField()
    region = serializers.CharField()
    zone = serializers.CharField()
    instance_type = serializers.CharField()
    spot = serializers.BooleanField()
    price_per_hour = serializers.FloatField()
    cpus = serializers.IntegerField()
    memory_bytes = serializers.IntegerField()
    disk_bytes = serializers.IntegerField()
    gpus = GpuOut(many=True)
    catalog_date = serializers.CharField(allow_null=True)


class OffersOut(serializers.Serializer[Any]):
    offers = OfferOut(many=True)
    shortfall = serializers.CharField()
    accounts = serializers.IntegerField()


MAX_OFFERS = 200


class OfferListView(WorkspaceAPIView):
    @extend_schema(
        responses=OffersOut,
        parameters=[
            OpenApiParameter("gpu", str, description="a GPU name, optionally with a count: A10G or A10G:4"),
            OpenApiParameter("memory", str, description="at least this much memory: 16GB"),
            OpenApiParameter("cpu", int),
            OpenApiParameter("spot_policy", str, enum=["spot", "on-demand", "auto"]),
            OpenApiParameter("region", str, description="comma-separated regions"),
            OpenApiParameter("backend", str, description="comma-separated backend kinds"),
        ],
    )
    def get(self, request: Request, workspace: str) -> Response:
        params = request.query_params
        req = offer_requirements(
            gpu=params.get("gpu", ""),
            memory=params.get("memory", ""),
            cpu=params.get("cpu", ""),
            spot_policy=params.get("spot_policy", "") or "auto",
            regions=params.get("region", ""),
        )
        backends = [b for b in params.get("backend", "").split(",") if b.strip()]
        choice = offers_rank(workspace_id=self.workspace.pk, req=req, backends=backends)
        offers = [_offer_out(c) for c in choice.candidates[:MAX_OFFERS]]
        return Response(OffersOut({"offers": offers, "shortfall": choice.shortfall, "accounts": choice.accounts}).data)


def _offer_out(candidate: Candidate) -> dict[str, Any]:
    offer = candidate.offer
    return {
        "offer_id": offer.offer_id,
        "backend": offer.backend,
        "account": candidate.account.name,
        "region": offer.region,
        "zone": offer.zone,
        "instance_type": offer.instance_type,
        "spot": offer.spot,
        "price_per_hour": offer.price_per_hour,
        "cpus": offer.cpus,
        "memory_bytes": offer.memory_bytes,
        "disk_bytes": offer.disk_bytes,
        "gpus": [g.to_data() for g in offer.gpus],
        "catalog_date": catalog_date(candidate.account),
    }

"""Input and output shapes of the runs API (docs/API.md)."""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from trainyard_spec.schema import BACKEND_KINDS

from backend.runs.models import Attempt, Job, Run


class WorkflowsFileIn(serializers.Serializer):
    path = serializers.CharField(max_length=300)
    text = serializers.CharField(max_length=1_000_000, allow_blank=True, trim_whitespace=False)


class CodeIn(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["git", "archive"])
    repo_url = serializers.CharField(max_length=500, required=False, default="")
    commit = serializers.CharField(max_length=64, required=False, default="")
    patch_blob = serializers.UUIDField(required=False, allow_null=True, default=None)
    archive_blob = serializers.UUIDField(required=False, allow_null=True, default=None)


class PlacementIn(serializers.Serializer):
    """Overrides of every workflow's placement keys (the CLI's --backend,
    --region, --spot-policy, --max-price); each absent key leaves the workflow's."""

    backends = serializers.ListField(
        child=serializers.ChoiceField(choices=list(BACKEND_KINDS)), required=False, allow_empty=False
    )
    regions = serializers.ListField(
        child=serializers.RegexField(r"^[a-z0-9][a-z0-9-]{0,63}$"), required=False, allow_empty=False
    )
    spot_policy = serializers.ChoiceField(choices=["spot", "on-demand", "auto"], required=False)
    max_price = serializers.FloatField(required=False, min_value=0.0001)


class RunCreateIn(serializers.Serializer):
    """``workflows_files`` (every file, as the CLI sends them) or the older
    single ``workflows_file``: exactly one of them."""

    workflow = serializers.CharField(max_length=200)
    workflows_file = WorkflowsFileIn(required=False)
    workflows_files = serializers.ListField(child=WorkflowsFileIn(), required=False, allow_empty=False, max_length=100)
    code = CodeIn()
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False, default=dict)
    # Values of the bare env names (env: [HF_TOKEN]) from the submitting shell.
    inherited_env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False, default=dict
    )
    # trainyard run WORKFLOW -- ARGS: the value of ${{ run.args }}.
    run_args = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False, default=list
    )
    # Per workflow name, the values of ${{ variables.NAME }} (-e NAME=… wins).
    variables = serializers.DictField(
        child=serializers.DictField(child=serializers.CharField(allow_blank=True, trim_whitespace=False)),
        required=False,
        default=dict,
    )
    no_cache = serializers.BooleanField(required=False, default=False)
    placement = PlacementIn(required=False, default=dict)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("workflows_file" in attrs) == ("workflows_files" in attrs):
            raise serializers.ValidationError("send workflows_files (a list of {path, text}) or workflows_file")
        attrs["files"] = attrs.pop("workflows_files", None) or [attrs.pop("workflows_file")]
        attrs.pop("workflows_file", None)
        return attrs


class PlanCodeIn(CodeIn):
    """A dry run sends digests instead of uploading the code."""

    patch_sha256 = serializers.RegexField(r"^[0-9a-f]{64}$", required=False, default="")
    archive_sha256 = serializers.RegexField(r"^[0-9a-f]{64}$", required=False, default="")


class RunPlanIn(RunCreateIn):
    code = PlanCodeIn()


class PlannedInputOut(serializers.Serializer):
    path = serializers.CharField()
    # The API's key is "source", which is also an attribute of every DRF field.
    source = serializers.CharField(source="from")  # type: ignore[assignment]


class CacheHitOut(serializers.Serializer):
    run = serializers.CharField()
    job = serializers.UUIDField()


class PlannedJobOut(serializers.Serializer):
    name = serializers.CharField()
    workflow = serializers.CharField()
    provider = serializers.CharField()
    needs = serializers.ListField(child=serializers.CharField())
    after_running = serializers.ListField(child=serializers.CharField())
    resources = serializers.DictField()
    inputs = serializers.ListField(child=serializers.DictField())
    cache = CacheHitOut(allow_null=True)
    commands = serializers.ListField(child=serializers.CharField())
    placement = serializers.DictField()  # the job's placement keys, overrides included
    # The cheapest offer it would start from: {offers, backend, instance_type,
    # region, spot, price_per_hour}, or {offers: 0, reason}.
    offer = serializers.DictField()


class RunPlanOut(serializers.Serializer):
    workflow = serializers.CharField()
    help = serializers.CharField(allow_blank=True)  # the workflow's help: ("" without)
    jobs = PlannedJobOut(many=True)


class TagIn(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    run = serializers.CharField(max_length=100, help_text="run name or id")
    force = serializers.BooleanField(required=False, default=False)


class TagOut(serializers.Serializer):
    name = serializers.CharField()
    run = serializers.CharField(source="run.name")
    run_id = serializers.UUIDField()
    created_by = serializers.CharField(source="created_by.username", default=None)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class AttemptOut(serializers.ModelSerializer):
    instance = serializers.CharField(source="instance.name", default=None)
    backend = serializers.CharField(source="instance.backend", default=None, help_text="the machine's backend")
    instance_type = serializers.CharField(source="instance.instance_type", default=None)
    region = serializers.CharField(source="instance.region", default=None)
    zone = serializers.CharField(source="instance.zone", default=None)
    spot = serializers.BooleanField(source="instance.spot", default=None, help_text="spot (true) or on-demand")
    reason = serializers.CharField(source="termination_reason")
    message = serializers.CharField(source="termination_message")

    class Meta:
        model = Attempt
        fields = [
            "number",
            "status",
            "instance",
            "backend",
            "instance_type",
            "region",
            "zone",
            "spot",
            "reason",
            "message",
            "exit_code",
            "started_at",
            "finished_at",
            "first_seq",
            "last_seq",
            "offers_tried",
            "restored_checkpoint",
            "created_at",
        ]
        read_only_fields = fields


class CheckpointVersionOut(serializers.Serializer):
    number = serializers.IntegerField()
    attempt = serializers.IntegerField(help_text="the attempt that synced it")
    size = serializers.IntegerField()
    files = serializers.IntegerField()
    completed_at = serializers.DateTimeField()


class CheckpointOut(serializers.Serializer):
    path = serializers.CharField()
    latest = CheckpointVersionOut(allow_null=True, help_text="the version an interrupted job resumes from")


class JobOut(serializers.ModelSerializer):
    instance = serializers.CharField(source="instance.name", default=None)
    attempts = serializers.SerializerMethodField()
    resources = serializers.SerializerMethodField()
    needs = serializers.SerializerMethodField()
    after_running = serializers.SerializerMethodField()
    cached_from = serializers.SerializerMethodField()
    inputs = serializers.SerializerMethodField()
    checkpoint = serializers.SerializerMethodField()
    provider = serializers.CharField(source="spec.provider", default="bash")

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "workflow",
            "provider",
            "status",
            "status_reason",
            "exit_code",
            "attempt",
            "attempts",
            "instance",
            "ports",
            "resources",
            "needs",
            "after_running",
            "cached_from",
            "inputs",
            "checkpoint",
            "placement",
            "on_demand_since",
            "placement_note",
            "created_at",
            "started_at",
            "finished_at",
            "last_seq",
        ]
        read_only_fields = fields

    def get_resources(self, job: Job) -> dict[str, Any]:
        return {"cpu": job.cpu, "memory_bytes": job.memory_bytes, "gpu_count": job.gpu_count, "gpu_name": job.gpu_name}

    @extend_schema_field(AttemptOut(many=True))
    def get_attempts(self, job: Job) -> list[dict[str, Any]]:
        attempts = sorted(job.attempts.all(), key=lambda a: a.number)
        return AttemptOut(attempts, many=True).data  # type: ignore[return-value]

    def get_needs(self, job: Job) -> list[str]:
        return sorted(j.name for j in job.needs.all())

    def get_after_running(self, job: Job) -> list[str]:
        return sorted(j.name for j in job.after_running.all())

    def get_cached_from(self, job: Job) -> dict[str, str] | None:
        source = job.cached_from
        return {"run": source.run.name, "job": str(source.pk)} if source is not None else None

    @extend_schema_field(CheckpointOut(allow_null=True))
    def get_checkpoint(self, job: Job) -> dict[str, Any] | None:
        from backend.artifacts.checkpoints import checkpoint_latest

        path = job.spec.get("checkpoint") or ""
        if not path:
            return None
        latest = checkpoint_latest(job=job)
        shown = None
        if latest is not None:
            shown = {
                "number": latest.number,
                "attempt": latest.attempt,
                "size": latest.total_size,
                "files": latest.files.count(),
                "completed_at": latest.completed_at,
            }
        return {"path": path, "latest": CheckpointOut({"path": path, "latest": shown}).data["latest"]}

    def get_inputs(self, job: Job) -> list[dict[str, str]]:
        from backend.runs.services.dag import job_inputs

        return [{"path": i.artifact.path, "from": i.origin} for i in job_inputs(job)]


class RunOut(serializers.ModelSerializer):
    submitted_by = serializers.CharField(source="submitted_by.username", default=None)
    duration_seconds = serializers.SerializerMethodField()
    code = serializers.SerializerMethodField()
    jobs = serializers.SerializerMethodField()
    tags = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id",
            "name",
            "workflow",
            "help",
            "status",
            "status_reason",
            "exit_code",
            "submitted_by",
            "created_at",
            "started_at",
            "finished_at",
            "duration_seconds",
            "no_cache",
            "tags",
            "code",
            "jobs",
        ]
        read_only_fields = fields

    def get_duration_seconds(self, run: Run) -> float | None:
        if run.started_at is None:
            return None
        if run.finished_at is None:
            return None
        return round((run.finished_at - run.started_at).total_seconds(), 3)

    def get_tags(self, run: Run) -> list[str]:
        return sorted(t.name for t in run.tags.all())

    def get_code(self, run: Run) -> dict[str, Any]:
        return {
            "kind": run.code_kind,
            "repo_url": run.repo_url,
            "commit": run.commit,
            "has_patch": run.patch_blob_id is not None,
        }

    @extend_schema_field(JobOut(many=True))
    def get_jobs(self, run: Run) -> list[dict[str, Any]]:
        jobs = run.jobs.select_related("instance", "cached_from__run").prefetch_related(
            "needs", "after_running", "attempts__instance"
        )
        # many=True makes a ListSerializer, whose data is a list (the stubs say a dict).
        return cast(list[dict[str, Any]], JobOut(sorted(jobs, key=lambda j: j.created_at), many=True).data)


class LogLineOut(serializers.Serializer):
    seq = serializers.IntegerField()
    ts = serializers.FloatField(help_text="unix time in seconds")
    stream = serializers.ChoiceField(choices=["o", "e"], help_text="o: stdout, e: stderr")
    text = serializers.CharField()


class LogPageOut(serializers.Serializer):
    job = serializers.UUIDField()
    lines = LogLineOut(many=True)
    has_more = serializers.BooleanField()


class BlobOut(serializers.Serializer):
    id = serializers.UUIDField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()


def run_to_dict(run: Run) -> dict[str, Any]:
    """The run as the API shows it, JSON-ready (also sent on websockets)."""
    import json

    from rest_framework.utils.encoders import JSONEncoder

    return json.loads(json.dumps(RunOut(run).data, cls=JSONEncoder))

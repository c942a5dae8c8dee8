"""Input and output shapes of the runs API (docs/API.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any, ClassVar, cast

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from trainyard_spec.schema import BACKEND_KINDS

from backend.billing.rules import AttemptBill
from backend.billing.selectors import attempt_bill_of, bills_total, run_costs, shown
from backend.core.urlcreds import url_without_credentials
from backend.runs.lifecycle.cachewhy import ReasonKind
from backend.runs.lifecycle.devenvs import dev_environment_shown
from backend.runs.models import Attempt, Job, Run
from backend.runs.selectors import JobData, JobExtras, job_attempts, job_data, job_extras, with_shown
from backend.runs.services.reproduced import ReproducedState, RerunVerdict, rerun_verdict


class WorkflowsFileIn(serializers.Serializer):
    path = serializers.CharField(max_length=300)
    text = serializers.CharField(max_length=1_000_000, allow_blank=True, trim_whitespace=False)


MAX_PATCH_FILES = 10000


class CodeIn(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["git", "archive"])
    # Blank is the default (an archive has neither), so blank is valid input too.
    repo_url = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    commit = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    patch_blob = serializers.UUIDField(required=False, allow_null=True, default=None)
    archive_blob = serializers.UUIDField(required=False, allow_null=True, default=None)
    # The files the patch touches, {path: sha256 of its part of the patch}, or
    # an archive's files, {path: sha256 of its mode and bytes}: only to name
    # the changed files in a cache decision (absent: unnamed).
    patch_files = serializers.DictField(
        child=serializers.RegexField(r"^[0-9a-f]{64}$"), required=False, allow_null=True, default=None
    )

    def validate_patch_files(self, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and (len(value) > MAX_PATCH_FILES or any(len(p) > 1000 for p in value)):
            raise serializers.ValidationError(f"at most {MAX_PATCH_FILES} paths of at most 1000 characters")
        return value


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


class ResourcesIn(serializers.Serializer):
    """Keys of ``resources:`` that replace every workflow's for all the run's
    jobs (the CLI's --gpu, --cpu, --memory, --disk), written as in the file;
    checked as the file's are when the run is planned (``gpu: none``: no GPU)."""

    gpu = serializers.CharField(required=False, max_length=100, help_text='e.g. "A10G:2", "2" or "none"')
    cpu = serializers.IntegerField(required=False, min_value=1)
    memory = serializers.CharField(required=False, max_length=32, help_text='e.g. "16GB"')
    disk = serializers.CharField(required=False, max_length=32, help_text='e.g. "100GB"')


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
    resources = ResourcesIn(required=False, default=dict)
    # trainyard env build: the run only builds the workflow's environment.
    environment_build = serializers.BooleanField(
        required=False, default=False, help_text="only build (and store) the workflow's environment; no commands run"
    )
    # Budgets (docs/COST.md, "Budgets and quotas").
    max_cost = serializers.CharField(
        required=False,
        allow_null=True,
        default=None,
        help_text="USD, e.g. \"20\": the run's own cap (wins over the workflow's max_cost)",
    )
    queue = serializers.BooleanField(
        required=False, default=False, help_text="over a budget: make the run and let its jobs wait for budget"
    )
    budget_override = serializers.BooleanField(
        required=False,
        default=False,
        help_text="admins: let the run past the workspace's and the submitter's budgets (audited)",
    )
    # {requirements file: {path: sha256}}: the environments' files as the
    # submitter's working tree holds them (docs/ENVIRONMENTS.md, "Before a job runs").
    environment_files = serializers.DictField(
        child=serializers.DictField(child=serializers.RegexField(r"^[0-9a-f]{64}$")),
        required=False,
        default=dict,
        help_text="by requirements file, the sha256 of it and of the files it includes (-r/-c)",
    )

    def validate_environment_files(self, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        paths = [p for files in value.values() for p in files] + list(value)
        if len(paths) > 1000:
            raise serializers.ValidationError("at most 1000 files")
        too_long = next((p for p in paths if not p or len(p) > 300), None)
        if too_long is not None:
            raise serializers.ValidationError(f"{too_long[:40]!r}: a path of 1 to 300 characters is wanted")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("workflows_file" in attrs) == ("workflows_files" in attrs):
            raise serializers.ValidationError("send workflows_files (a list of {path, text}) or workflows_file")
        attrs["files"] = attrs.pop("workflows_files", None) or [attrs.pop("workflows_file")]
        attrs.pop("workflows_file", None)
        return attrs


class PlanCodeIn(CodeIn):
    """A dry run sends digests instead of uploading the code."""

    # Absent: the uploaded blob's own digest is used.
    patch_sha256 = serializers.RegexField(r"^[0-9a-f]{64}$", required=False)
    archive_sha256 = serializers.RegexField(r"^[0-9a-f]{64}$", required=False)


class RunPlanIn(RunCreateIn):
    code = PlanCodeIn()


class CacheHitOut(serializers.Serializer):
    run = serializers.CharField()
    job = serializers.UUIDField()


class CacheReasonOut(serializers.Serializer):
    kind = serializers.ChoiceField(choices=[k.value for k in ReasonKind])
    text = serializers.CharField()


class CacheDecisionOut(serializers.Serializer):
    """Why a job is reused from the cache or runs (docs/RUNS.md, "The cache")."""

    reused = serializers.BooleanField()
    text = serializers.CharField(help_text='"reused from <run> (cached)" or "runs: <reason>; <reason>"')
    run = serializers.CharField(required=False, help_text="reused: the run whose job did the work")
    compared_with = serializers.CharField(
        required=False, allow_blank=True, help_text='runs: the earlier run it was compared with ("": none)'
    )
    reasons = CacheReasonOut(many=True)


class PlannedEnvironmentOut(serializers.Serializer):
    """Whether a planned job's environment is built already (docs/ENVIRONMENTS.md)."""

    state = serializers.ChoiceField(
        choices=["ready", "to build", "unknown"],
        help_text='"ready": a runner of the workspace built it; "to build"; "unknown": no digests of its files sent',
    )
    key = serializers.CharField(allow_blank=True, help_text="ready: the key it was built under")
    built_on = serializers.CharField(allow_blank=True, help_text="ready: the instance that built it")
    stored = serializers.BooleanField(help_text="ready: packed in storage, so other machines restore it")
    build_seconds = serializers.FloatField(
        allow_null=True, help_text="ready: its build's; to build: the last build of the workflow's environment"
    )


class PlannedDataOut(serializers.Serializer):
    uri = serializers.CharField()
    path = serializers.CharField()
    file_count = serializers.IntegerField()
    total_size = serializers.IntegerField()
    size = serializers.CharField(help_text="total_size in words (1.2 GiB)")
    versioned = serializers.BooleanField(help_text="every object has a version id (a re-run reads these again)")
    snapshot = serializers.CharField(help_text="the listing's digest (part of the job's cache key)")
    cached_on = serializers.ListField(
        child=serializers.CharField(), help_text="idle machines of the workspace whose cache holds it"
    )


class VolumeHolderOut(serializers.Serializer):
    job = serializers.CharField()
    run = serializers.CharField()


class PlannedVolumeOut(serializers.Serializer):
    name = serializers.CharField()
    path = serializers.CharField()
    # The key as the workflow spells it; DRF takes the name off the class, as for every field.
    read_only = serializers.BooleanField()  # type: ignore[assignment]
    where = serializers.CharField(help_text="aws <region> <zone>, machine <name> (self-hosted) or local")
    size_bytes = serializers.IntegerField()
    held_by = VolumeHolderOut(allow_null=True, help_text="the job (and its run) holding it now; null: free")


class PlannedJobOut(serializers.Serializer):
    name = serializers.CharField()
    workflow = serializers.CharField()
    provider = serializers.CharField()
    needs = serializers.ListField(child=serializers.CharField())
    after_running = serializers.ListField(child=serializers.CharField())
    resources = serializers.DictField()
    inputs = serializers.ListField(child=serializers.DictField())
    data_inputs = PlannedDataOut(many=True, help_text="its inputs: (docs/DATA.md), as listed now")
    volumes = PlannedVolumeOut(many=True, help_text="its volumes (docs/DATA.md), where each is and who holds it now")
    cache = CacheHitOut(allow_null=True)
    cache_decision = CacheDecisionOut()
    commands = serializers.ListField(child=serializers.CharField())
    environment = PlannedEnvironmentOut(allow_null=True)
    placement = serializers.DictField()  # the job's placement keys, overrides included
    guards = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="its guards (utilization_policy, stall; the workflow's or the workspace's default) in words",
    )
    # The cheapest offer it would start from: {offers, backend, instance_type,
    # region, spot, price_per_hour}, or {offers: 0, reason}.
    offer = serializers.DictField()
    max_cost = serializers.CharField(
        allow_null=True,
        help_text="USD: the most it may cost, its offer's price × its max_duration; null: no max_duration or no offer",
    )


class RunPlanOut(serializers.Serializer):
    workflow = serializers.CharField()
    help = serializers.CharField(allow_blank=True)  # the workflow's help: ("" without)
    jobs = PlannedJobOut(many=True)
    estimate = serializers.CharField(
        allow_null=True, help_text="USD: the most the run may cost (its jobs' max_cost); null if any is null"
    )


class TagIn(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    run = serializers.CharField(max_length=100, help_text="run name or id")
    force = serializers.BooleanField(required=False, default=False)


class TagOut(serializers.Serializer):
    name = serializers.CharField()
    run = serializers.CharField(source="run.name")
    run_id = serializers.UUIDField()
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class EnvironmentOut(serializers.Serializer):
    key = serializers.CharField(help_text="digest of the spec, its files and the platform (docs/ENVIRONMENTS.md)")
    platform = serializers.DictField(child=serializers.CharField())
    build_seconds = serializers.FloatField(help_text="how long its build took")
    size_bytes = serializers.IntegerField()
    packages = serializers.IntegerField(source="package_count", help_text="how many packages are installed")
    built_on = serializers.CharField(help_text="the machine that reported it first")
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField()
    runs = serializers.IntegerField(source="run_count", help_text="runs whose jobs ran in it")
    stored = serializers.BooleanField(
        help_text="packed into the workspace's storage: a runner on another machine restores it instead of building"
    )


class EnvironmentDetailOut(EnvironmentOut):
    lock = serializers.CharField(help_text="the resolved requirements, with versions and hashes")
    installed = serializers.CharField(source="packages", help_text="`uv pip freeze` after the setup commands")
    recent_runs = serializers.SerializerMethodField(help_text="the latest 20 runs that used it")

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_recent_runs(self, obj: object) -> list[str]:
        return list(self.context.get("recent_runs", []))


class SourceWorkflowOut(serializers.Serializer):
    name = serializers.CharField()
    provider = serializers.CharField()
    help = serializers.CharField()


class RunSourceOut(serializers.Serializer):
    repo = serializers.CharField(help_text="the repository's URL, or `uploaded code (no git)`")
    run = serializers.CharField(help_text="the last run submitted from it: its code and files are used again")
    submitted_at = serializers.DateTimeField()
    submitted_by = serializers.CharField()
    code = CodeIn()
    workflows_files = WorkflowsFileIn(many=True)
    environment_files = serializers.DictField(child=serializers.DictField(child=serializers.CharField()))
    workflows = SourceWorkflowOut(
        many=True, help_text="the workflows the files define (none when they no longer parse)"
    )


class LineageRunOut(serializers.Serializer):
    name = serializers.CharField()
    workflow = serializers.CharField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()
    submitted_by = serializers.CharField()
    tags = serializers.ListField(child=serializers.CharField())
    distance = serializers.IntegerField(
        help_text="steps from the run asked about: negative upstream (it fed that run), positive downstream, 0 itself"
    )


class LineageEdgeOut(serializers.Serializer):
    producer = serializers.CharField(help_text="the run whose artifacts were read")
    consumer = serializers.CharField(help_text="the run that read them")
    kind = serializers.ChoiceField(
        choices=["tag", "run", "workflow", "cache"],
        help_text="how: `deps: - tag:`, `- run:`, another repository's `- workflow:`, or a job reused from the cache",
    )
    name = serializers.CharField(help_text="the tag, run or workflow the deps named (the job's name for cache)")
    job = serializers.CharField(help_text="the consumer's job")


class LineageOut(serializers.Serializer):
    run = serializers.CharField()
    depth = serializers.IntegerField()
    truncated = serializers.BooleanField(help_text="more runs lie past the depth or the size bound")
    runs = LineageRunOut(many=True)
    edges = LineageEdgeOut(many=True)


class AttemptOut(serializers.ModelSerializer):
    instance = serializers.CharField(source="instance.name", default=None, allow_null=True)
    backend = serializers.CharField(
        source="instance.backend", default=None, allow_null=True, help_text="the machine's backend"
    )
    instance_type = serializers.CharField(source="instance.instance_type", default=None, allow_null=True)
    region = serializers.CharField(source="instance.region", default=None, allow_null=True)
    zone = serializers.CharField(source="instance.zone", default=None, allow_null=True)
    spot = serializers.BooleanField(
        source="instance.spot", default=None, allow_null=True, help_text="spot (true) or on-demand"
    )
    reason = serializers.CharField(source="termination_reason")
    message = serializers.CharField(source="termination_message")
    environment = serializers.CharField(
        source="environment_key",
        read_only=True,
        help_text="the key of the environment its commands ran in (docs/ENVIRONMENTS.md); empty for none",
    )
    cost = serializers.SerializerMethodField(
        help_text='USD, a decimal string ("0.7010"): price_per_hour x billed_seconds; null: it held no machine'
    )
    price_per_hour = serializers.SerializerMethodField(help_text="USD, its machine's price; null: no machine")
    billed_seconds = serializers.SerializerMethodField(
        help_text="the whole seconds it held its machine (until now while it runs); null: no machine"
    )

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
            "environment",
            "cost",
            "price_per_hour",
            "billed_seconds",
            "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_cost(self, attempt: Attempt) -> str | None:
        bill = self._bill(attempt)
        return shown(bill.cost) if bill is not None else None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_price_per_hour(self, attempt: Attempt) -> str | None:
        bill = self._bill(attempt)
        return str(bill.price_per_hour) if bill is not None else None

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_billed_seconds(self, attempt: Attempt) -> int | None:
        bill = self._bill(attempt)
        return bill.seconds if bill is not None else None

    def _bill(self, attempt: Attempt) -> AttemptBill | None:
        return attempt_bill_of(attempt, shown_now(self.context))


def shown_now(context: Mapping[str, Any]) -> datetime:
    """The one "now" a response's live costs accrue to (set on first use)."""
    if isinstance(context, dict):
        return cast(datetime, context.setdefault("now", timezone.now()))
    return cast(datetime, context.get("now") or timezone.now())


class CheckpointVersionOut(serializers.Serializer):
    number = serializers.IntegerField()
    attempt = serializers.IntegerField(help_text="the attempt that synced it")
    size = serializers.IntegerField()
    files = serializers.IntegerField()
    completed_at = serializers.DateTimeField()


class CheckpointOut(serializers.Serializer):
    path = serializers.CharField()
    latest = CheckpointVersionOut(allow_null=True, help_text="the version an interrupted job resumes from")


class DevEnvironmentOut(serializers.Serializer):
    """A dev environment (``provider: code | lab | notebook``; docs/ACCESS.md)."""

    kind = serializers.ChoiceField(choices=["code", "lab", "notebook"])
    inactivity_seconds = serializers.IntegerField(
        allow_null=True, help_text="stopped after this long with no session into it; null: never"
    )
    app_port = serializers.IntegerField(
        allow_null=True, help_text="the port Jupyter serves on (lab, notebook), once the job runs; else null"
    )


class JobOut(serializers.ModelSerializer):
    instance = serializers.CharField(source="instance.name", default=None, allow_null=True)
    attempts = serializers.SerializerMethodField()
    resources = serializers.SerializerMethodField()
    needs = serializers.SerializerMethodField()
    after_running = serializers.SerializerMethodField()
    cached_from = serializers.SerializerMethodField()
    cache_decision = serializers.SerializerMethodField()
    inputs = serializers.SerializerMethodField()
    checkpoint = serializers.SerializerMethodField()
    provider = serializers.CharField(source="spec.provider", default="bash")
    dev_environment = serializers.SerializerMethodField()
    cost = serializers.SerializerMethodField(
        help_text="USD, a decimal string: the sum of its attempts' costs; null: none held a machine"
    )

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
            "cost",
            "instance",
            "ports",
            "resources",
            "needs",
            "after_running",
            "cached_from",
            "cache_decision",
            "inputs",
            "checkpoint",
            "placement",
            "on_demand_since",
            "placement_note",
            "created_at",
            "started_at",
            "finished_at",
            "last_seq",
            "log_bytes",
            "log_note",
            "dev_environment",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_cost(self, job: Job) -> str | None:
        return shown(job_cost(job, shown_now(self.context)))

    @extend_schema_field(DevEnvironmentOut(allow_null=True))
    def get_dev_environment(self, job: Job) -> dict[str, Any] | None:
        return dev_environment_shown(job.spec, job.ports)

    def get_resources(self, job: Job) -> dict[str, Any]:
        return {"cpu": job.cpu, "memory_bytes": job.memory_bytes, "gpu_count": job.gpu_count, "gpu_name": job.gpu_name}

    @extend_schema_field(AttemptOut(many=True))
    def get_attempts(self, job: Job) -> list[dict[str, Any]]:
        # One AttemptOut for every job: building a serializer's fields costs more than using them.
        if not hasattr(self, "_attempt_out"):
            self._attempt_out = AttemptOut(context=self.context)
        return [self._attempt_out.to_representation(a) for a in job_attempts(job)]

    def get_needs(self, job: Job) -> list[str]:
        names = getattr(job, "need_names", None)  # selectors.with_shown: an array column
        return sorted(names if names is not None else (j.name for j in job.needs.all()))

    def get_after_running(self, job: Job) -> list[str]:
        names = getattr(job, "after_names", None)  # selectors.with_shown: an array column
        return sorted(names if names is not None else (j.name for j in job.after_running.all()))

    def get_cached_from(self, job: Job) -> dict[str, str] | None:
        source = job.cached_from
        return {"run": source.run.name, "job": str(source.pk)} if source is not None else None

    @extend_schema_field(CacheDecisionOut(allow_null=True))
    def get_cache_decision(self, job: Job) -> dict[str, Any] | None:
        """None until the job was ready and the scheduler decided."""
        return job.cache_decision or None

    @extend_schema_field(CheckpointOut(allow_null=True))
    def get_checkpoint(self, job: Job) -> dict[str, Any] | None:
        path = job.spec.get("checkpoint") or ""
        if not path:
            return None
        pointer = self._extras(job).checkpoints.get(job.pk)
        shown = None
        if pointer is not None:
            latest = pointer.version
            shown = {
                "number": latest.number,
                "attempt": latest.attempt,
                "size": latest.total_size,
                "files": pointer.version_files,  # type: ignore[attr-defined]
                "completed_at": latest.completed_at,
            }
        return {"path": path, "latest": CheckpointOut({"path": path, "latest": shown}).data["latest"]}

    def get_inputs(self, job: Job) -> list[dict[str, str]]:
        return [{"path": path, "from": origin} for path, origin in self._extras(job).inputs.get(job.pk, [])]

    def _extras(self, job: Job) -> JobExtras:
        """The batch a list passed in its context (``job_extras``), else this job's own."""
        extras = self.context.get("job_extras")
        return cast(JobExtras, extras) if extras is not None else job_extras(jobs=[job])


class JobDataInputOut(serializers.Serializer):
    """A data input of a job (its workflow's ``inputs:``), as listed when the run was submitted."""

    uri = serializers.CharField()
    path = serializers.CharField(help_text="where it is placed in the job's working directory")
    # Output only: DRF's ``read_only`` (of a field) is an attribute of instances, never read here.
    read_only = serializers.BooleanField()  # type: ignore[assignment]
    file_count = serializers.IntegerField(allow_null=True, help_text="null: its listing is not known")
    total_size = serializers.IntegerField(allow_null=True, help_text="bytes; null: its listing is not known")
    versioned = serializers.BooleanField(help_text="every object has a version id (a re-run reads these again)")


class JobVolumeOut(serializers.Serializer):
    """A volume of the workspace the job mounts (its workflow's ``volumes:``)."""

    name = serializers.CharField()
    path = serializers.CharField()
    read_only = serializers.BooleanField()  # type: ignore[assignment]  # as JobDataInputOut's


class JobDetailOut(JobOut):
    """A job as its run's page shows it: also the data it reads and the volumes it mounts."""

    data_inputs = serializers.SerializerMethodField()
    volumes = serializers.SerializerMethodField()

    class Meta(JobOut.Meta):
        fields = [*JobOut.Meta.fields, "data_inputs", "volumes"]
        read_only_fields = fields

    @extend_schema_field(JobDataInputOut(many=True))
    def get_data_inputs(self, job: Job) -> list[dict[str, Any]]:
        return self._data(job).inputs

    @extend_schema_field(JobVolumeOut(many=True))
    def get_volumes(self, job: Job) -> list[dict[str, Any]]:
        return self._data(job).volumes

    def _data(self, job: Job) -> JobData:
        """The batch a run passed in its context (``job_data``), else this job's own."""
        batch = self.context.get("job_data")
        if batch is not None:
            return cast(dict[Any, JobData], batch)[job.pk]
        return job_data(workspace_id=job.workspace_id, specs={job.pk: job.spec})[job.pk]


def job_cost(job: Job, now: datetime) -> Decimal | None:
    return bills_total((a.started_at, attempt_bill_of(a, now)) for a in job_attempts(job))


class ArtifactDifferenceOut(serializers.Serializer):
    job = serializers.CharField()
    path = serializers.CharField(help_text="the artifact's path (./model)")
    files = serializers.ListField(
        child=serializers.CharField(), help_text="a few of the files changed, added or missing (sorted)"
    )
    more_files = serializers.IntegerField(source="more", help_text="how many other files differ")
    only_in = serializers.CharField(
        allow_blank=True, help_text='"the re-run" or "the original" when only one side has the artifact; else ""'
    )
    text = serializers.CharField(help_text='in words: "train ./model (model.bin)"')


class ReproducedOut(serializers.Serializer):
    """Whether a re-run's artifacts match its original's (docs/ENVIRONMENTS.md, "Reproduced")."""

    state = serializers.ChoiceField(choices=[s.value for s in ReproducedState])
    detail = serializers.CharField(
        help_text='"every artifact byte-identical (3 files)", what differs, or why nothing could be compared'
    )
    differences = ArtifactDifferenceOut(many=True)


class RunOut(serializers.ModelSerializer):
    submitted_by = serializers.CharField(source="submitted_by.username", default=None, allow_null=True)
    duration_seconds = serializers.SerializerMethodField()
    code = serializers.SerializerMethodField()
    jobs = serializers.SerializerMethodField()
    tags = serializers.SerializerMethodField()
    rerun_of = serializers.SerializerMethodField()
    reproduced = serializers.SerializerMethodField()
    cost = serializers.SerializerMethodField(
        help_text="USD, a decimal string: the sum over every attempt of every job (live while one runs); "
        "null: none held a machine"
    )
    max_cost = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="USD, a decimal string: the run's own cap (max_cost in the workflow or --max-cost); "
        "null: only the budgets cap it",
    )
    budget_override = serializers.BooleanField(
        read_only=True, help_text="an admin let it run past the workspace's and its submitter's budgets"
    )

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
            "cost",
            "max_cost",
            "budget_override",
            "no_cache",
            "environment_build",
            "tags",
            "code",
            "rerun_of",
            "reproduced",
            "jobs",
        ]
        read_only_fields = fields

    def get_duration_seconds(self, run: Run) -> float | None:
        if run.started_at is None:
            return None
        if run.finished_at is None:
            return None
        return round((run.finished_at - run.started_at).total_seconds(), 3)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_cost(self, run: Run) -> str | None:
        """From the jobs ``with_shown`` prefetched, else one query."""
        now = shown_now(self.context)
        if "jobs" not in getattr(run, "_prefetched_objects_cache", {}):
            return shown(run_costs([run.pk], now).get(run.pk))
        costs = [cost for job in run.jobs.all() if (cost := job_cost(job, now)) is not None]
        return shown(sum(costs, Decimal(0))) if costs else None

    def get_tags(self, run: Run) -> list[str]:
        names = getattr(run, "tag_names", None)  # selectors.with_shown: an array column
        return sorted(names if names is not None else (t.name for t in run.tags.all()))

    def get_code(self, run: Run) -> dict[str, Any]:
        return {
            "kind": run.code_kind,
            # A run stored before credentials were stripped at submission shows none either.
            "repo_url": url_without_credentials(run.repo_url),
            "commit": run.commit,
            "has_patch": run.patch_blob_id is not None,
        }

    @extend_schema_field(serializers.CharField(allow_null=True, help_text="a re-run: the original run's name"))
    def get_rerun_of(self, run: Run) -> str | None:
        verdict = self._verdict(run)
        return verdict.original if verdict is not None else None

    @extend_schema_field(
        ReproducedOut(allow_null=True, help_text="a re-run: whether its artifacts match the original's")
    )
    def get_reproduced(self, run: Run) -> dict[str, Any] | None:
        verdict = self._verdict(run)
        return ReproducedOut(verdict).data if verdict is not None else None

    def _verdict(self, run: Run) -> RerunVerdict | None:
        """The batch a list passed in its context (``rerun_verdicts``), else this run's own (computed once)."""
        batch = self.context.get("rerun_verdicts")
        if batch is not None:
            return cast(dict[Any, RerunVerdict], batch).get(run.pk)
        own = getattr(self, "_own_verdict", None)
        if own is None or own[0] != run.pk:
            own = self._own_verdict = (run.pk, rerun_verdict(run=run))
        return cast(RerunVerdict | None, own[1])

    job_out: ClassVar[type[JobOut]] = JobOut

    @extend_schema_field(JobOut(many=True))
    def get_jobs(self, run: Run) -> list[dict[str, Any]]:
        """The jobs ``with_shown`` prefetched (a list passes ``job_extras`` for
        all its runs' jobs); a run fetched otherwise gets its own, in the same
        constant number of queries."""
        if "jobs" not in getattr(run, "_prefetched_objects_cache", {}):
            run = with_shown(Run.objects.filter(pk=run.pk)).get()
        jobs = sorted(run.jobs.all(), key=lambda j: (j.created_at, str(j.pk)))
        if "job_extras" not in self.context:
            shown = self.job_out(jobs, many=True, context=self._jobs_context(run, jobs))
            return cast(list[dict[str, Any]], shown.data)
        # One JobOut for every run of a page: building a serializer's fields costs more than using them.
        if not hasattr(self, "_job_out"):
            self._job_out = self.job_out(context=self.context)
        return [self._job_out.to_representation(j) for j in jobs]

    def _jobs_context(self, run: Run, jobs: list[Job]) -> dict[str, Any]:
        return {"job_extras": job_extras(jobs=jobs)}


class RunDetailOut(RunOut):
    """One run as its page, its followers and the answers about it show it:
    each job also with the data it reads and the volumes it mounts."""

    job_out = JobDetailOut

    @extend_schema_field(JobDetailOut(many=True))
    def get_jobs(self, run: Run) -> list[dict[str, Any]]:
        return super().get_jobs(run)

    def _jobs_context(self, run: Run, jobs: list[Job]) -> dict[str, Any]:
        specs = {job.pk: job.spec for job in jobs}
        return {**super()._jobs_context(run, jobs), "job_data": job_data(workspace_id=run.workspace_id, specs=specs)}


class RerunOut(RunDetailOut):
    """A re-run as made: the run, and what it reads differently from the one it repeats."""

    notices = serializers.ListField(
        child=serializers.CharField(),
        help_text="e.g. an input whose bucket keeps no versions: read as it is now, not as the first run read it",
    )
    resumed = serializers.ListField(
        child=serializers.CharField(),
        help_text="the jobs resumed in place from their checkpoints (a run the budget stopped); [] for a new run",
    )

    class Meta(RunDetailOut.Meta):
        fields = [*RunDetailOut.Meta.fields, "notices", "resumed"]
        read_only_fields = fields


class RunPageOut(serializers.Serializer):
    count = serializers.IntegerField(help_text="matching runs: exact, or an estimate when count_estimated")
    count_estimated = serializers.BooleanField(help_text="count is the planner's estimate (above a threshold)")
    next = serializers.URLField(allow_null=True, help_text="the next page (a cursor link); null on the last")
    previous = serializers.URLField(allow_null=True, help_text="always null: pages are followed forward")
    results = RunOut(many=True)


class LogLineOut(serializers.Serializer):
    seq = serializers.IntegerField()
    ts = serializers.FloatField(help_text="unix time in seconds")
    stream = serializers.ChoiceField(choices=["o", "e"], help_text="o: stdout, e: stderr")
    text = serializers.CharField()


class LogPageOut(serializers.Serializer):
    job = serializers.UUIDField()
    lines = LogLineOut(many=True)
    has_more = serializers.BooleanField(
        help_text="lines are left in the direction read (before the first for before_seq and tail)"
    )
    last_seq = serializers.IntegerField(help_text="the job's watermark: its highest seq received")


class LogSearchOut(serializers.Serializer):
    job = serializers.UUIDField()
    seq = serializers.IntegerField(allow_null=True, help_text="the nearest matching line, or null")
    last_seq = serializers.IntegerField()
    # Output only: DRF's ``partial`` (of updates) is an attribute of instances, never read here.
    partial = serializers.BooleanField(  # type: ignore[assignment]
        help_text="no match before the search's byte budget ran out, short of the log's end (prev: start)"
    )
    searched_to = serializers.IntegerField(
        allow_null=True,
        help_text="when partial: the last seq read (for prev: the first); search again from just past it to go on",
    )


class BlobOut(serializers.Serializer):
    id = serializers.UUIDField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()


def run_to_dict(run: Run, *, shape: type[RunOut] = RunDetailOut) -> dict[str, Any]:
    """The run as the API shows it, JSON-ready: as its page and websockets
    do (``RunDetailOut``), or as the runs list does (``shape=RunOut``)."""
    import json

    from rest_framework.utils.encoders import JSONEncoder

    return json.loads(json.dumps(shape(run).data, cls=JSONEncoder))


class NamesOut(serializers.Serializer):
    names = serializers.ListField(child=serializers.CharField(), help_text="at most 50, runs newest first")

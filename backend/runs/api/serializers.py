"""Input and output shapes of the runs API (docs/API.md)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from backend.runs.models import Job, Run


class WorkflowsFileIn(serializers.Serializer):
    path = serializers.CharField(max_length=300)
    text = serializers.CharField(max_length=1_000_000, allow_blank=True, trim_whitespace=False)


class CodeIn(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["git", "archive"])
    repo_url = serializers.CharField(max_length=500, required=False, default="")
    commit = serializers.CharField(max_length=64, required=False, default="")
    patch_blob = serializers.UUIDField(required=False, allow_null=True, default=None)
    archive_blob = serializers.UUIDField(required=False, allow_null=True, default=None)


class RunCreateIn(serializers.Serializer):
    workflow = serializers.CharField(max_length=200)
    workflows_file = WorkflowsFileIn()
    code = CodeIn()
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False, default=dict)


class JobOut(serializers.ModelSerializer):
    instance = serializers.CharField(source="instance.name", default=None)
    resources = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id", "name", "workflow", "status", "status_reason", "exit_code", "attempt", "instance",
            "resources", "created_at", "started_at", "finished_at", "last_seq",
        ]
        read_only_fields = fields

    def get_resources(self, job: Job) -> dict[str, Any]:
        return {"cpu": job.cpu, "memory_bytes": job.memory_bytes, "gpu_count": job.gpu_count, "gpu_name": job.gpu_name}


class RunOut(serializers.ModelSerializer):
    submitted_by = serializers.CharField(source="submitted_by.username", default=None)
    duration_seconds = serializers.SerializerMethodField()
    code = serializers.SerializerMethodField()
    jobs = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id", "name", "workflow", "status", "status_reason", "exit_code", "submitted_by",
            "created_at", "started_at", "finished_at", "duration_seconds", "code", "jobs",
        ]
        read_only_fields = fields

    def get_duration_seconds(self, run: Run) -> float | None:
        if run.started_at is None:
            return None
        if run.finished_at is None:
            return None
        return round((run.finished_at - run.started_at).total_seconds(), 3)

    def get_code(self, run: Run) -> dict[str, Any]:
        return {
            "kind": run.code_kind, "repo_url": run.repo_url, "commit": run.commit,
            "has_patch": run.patch_blob_id is not None,
        }

    def get_jobs(self, run: Run) -> list[dict[str, Any]]:
        jobs = sorted(run.jobs.all(), key=lambda j: j.created_at)
        return JobOut(jobs, many=True).data


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

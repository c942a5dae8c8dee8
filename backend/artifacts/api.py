"""REST views for artifacts: browsing and downloading (users), uploading (runners)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponseRedirect
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.accounts.auth import token_from_header
from backend.accounts.tenancy import WorkspaceAPIView
from backend.artifacts.archive import archive_url
from backend.artifacts.caches import cache_begin, cache_complete
from backend.artifacts.checkpoints import checkpoint_begin, checkpoint_complete
from backend.artifacts.locations import storage_of
from backend.artifacts.models import Artifact, ArtifactKind, ArtifactStatus
from backend.artifacts.services import (
    FileIn,
    artifact_begin,
    artifact_complete,
    artifact_file_key,
    artifact_parts_complete,
    artifact_upload_targets,
    path_problem,
)
from backend.artifacts.storage import Part
from backend.clouds.models import Instance
from backend.clouds.services.instances import instance_for_token
from backend.core.errors import ApplicationError, NotFound
from backend.runs.lifecycle.dispatch import job_download_url
from backend.runs.lifecycle.transitions import attempt_wind_down_end, attempt_winding_down
from backend.runs.models import ACTIVE_JOB, Job
from backend.runs.selectors import run_get


class ArtifactFileOut(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()


class ArtifactOut(serializers.ModelSerializer):
    files = ArtifactFileOut(many=True)

    class Meta:
        model = Artifact
        fields = ["id", "job", "path", "status", "total_size", "files", "created_at"]
        read_only_fields = fields


class RunArtifactsView(WorkspaceAPIView):
    @extend_schema(responses=ArtifactOut(many=True))
    def get(self, request: Request, workspace: str, run: str) -> Response:
        found = run_get(workspace=self.workspace, ref=run)
        if found is None:
            raise NotFound(f"Run {run!r} not found.")
        artifacts = list(found.artifacts.prefetch_related("files").order_by("created_at", "path"))
        # A mounted artifact's next upload under way: its last complete one is what there is to see.
        complete = {(a.job_id, a.path) for a in artifacts if a.status == ArtifactStatus.COMPLETE}
        shown = [a for a in artifacts if a.status == ArtifactStatus.COMPLETE or (a.job_id, a.path) not in complete]
        return Response(ArtifactOut(shown, many=True).data)


class ArtifactFileView(WorkspaceAPIView):
    @extend_schema(responses={302: None})
    def get(self, request: Request, workspace: str, artifact: str, path: str) -> HttpResponseRedirect:
        found = (
            Artifact.objects.for_workspace(self.workspace).filter(pk=artifact, status=ArtifactStatus.COMPLETE).first()
        )
        file = found.files.filter(path=path).first() if found and not path_problem(path) else None
        if found is None or file is None:
            raise NotFound("Artifact file not found.")
        name = path.rsplit("/", 1)[-1]
        url = storage_of(found).signed_url(artifact_file_key(found, file), method="GET", seconds=300, filename=name)
        return HttpResponseRedirect(url)


class ArtifactArchiveView(WorkspaceAPIView):
    @extend_schema(responses={302: None}, parameters=[OpenApiParameter("prefix", str)])
    def get(self, request: Request, workspace: str, artifact: str) -> HttpResponseRedirect:
        found = (
            Artifact.objects.for_workspace(self.workspace).filter(pk=artifact, status=ArtifactStatus.COMPLETE).first()
        )
        if found is None:
            raise NotFound("Artifact not found.")
        prefix = request.query_params.get("prefix", "")
        if prefix and not found.files.filter(path__startswith=prefix).exists():
            raise NotFound(f"No files under {prefix!r} in this artifact.")
        return HttpResponseRedirect(archive_url(artifact=found, prefix=prefix))


# ------------------------------------------------------------- runner side


def _file_path(value: str) -> None:
    problem = path_problem(value)
    if problem:
        raise serializers.ValidationError(f"{value!r} {problem}")


def _artifact_path(value: str) -> None:
    problem = path_problem(value, dot_start=True, absolute_ok=True)
    if problem:
        raise serializers.ValidationError(f"{value!r} {problem}")


class FileIn_(serializers.Serializer):
    path = serializers.CharField(max_length=1000, validators=[_file_path], trim_whitespace=False)
    size = serializers.IntegerField(min_value=0)
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$")


class ArtifactBeginIn(serializers.Serializer):
    path = serializers.CharField(max_length=500, validators=[_artifact_path], trim_whitespace=False)
    # many=True hands max_length to the ListSerializer; the stubs do not know that.
    files = FileIn_(many=True, max_length=100_000)  # type: ignore[call-arg]


class RunnerAPIView(APIView):
    """Authenticated by the runner's own token; only its active jobs."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    def runner_job(self, request: Request, job_id: str) -> Job:
        """The job, if ``?attempt=`` is its current attempt on this runner (fencing)."""
        job, _ = self.runner_attempt(request, job_id, winding_down=False)
        return job

    def runner_instance_attempt(self, request: Request) -> tuple[Instance, str]:
        """The calling runner's instance and the ``?attempt=`` it names."""
        token = token_from_header(request.META.get("HTTP_AUTHORIZATION", ""))
        instance = instance_for_token(token=token) if token else None
        if instance is None:
            raise ApplicationError("Unknown runner token.", status_code=401)
        attempt = request.query_params.get("attempt", "")
        if not attempt.isdigit():
            raise ApplicationError("Say which attempt: ?attempt=N (runner protocol 2).", status_code=400)
        return instance, attempt

    def runner_attempt(self, request: Request, job_id: str, *, winding_down: bool) -> tuple[Job, bool]:
        """(the job, whether ``?attempt=`` is winding down): its current
        attempt on this runner, or, with ``winding_down``, an attempt of it
        this runner was interrupted in and still syncs the checkpoint of
        (until the machine's deadline: ``attempt_winding_down``)."""
        instance, attempt = self.runner_instance_attempt(request)
        if winding_down and attempt_winding_down(job_id=job_id, instance_id=str(instance.pk), attempt=int(attempt)):
            return Job.objects.get(pk=job_id), True
        active = Job.objects.filter(pk=job_id, status__in=ACTIVE_JOB)
        job = active.held_by(instance_id=instance.pk, attempt=int(attempt)).first()
        if job is not None:
            return job, False
        current = active.filter(instance=instance).values_list("attempt", flat=True).first()
        if current is None:
            raise NotFound("No such active job on this runner.")
        raise ApplicationError(
            f"Attempt {attempt} of this job is no longer current (attempt {current} is): stop it.", status_code=409
        )

    def runner_checkpoint(self, request: Request, job_id: str, artifact_id: str) -> Artifact:
        """An artifact of the job being uploaded by this runner; an attempt
        winding down reaches only its own checkpoint versions."""
        job, winding_down = self.runner_attempt(request, job_id, winding_down=True)
        row = Artifact.stored.filter(pk=artifact_id, job=job).first()
        attempt = int(request.query_params["attempt"])
        if row is None or (winding_down and (row.kind != ArtifactKind.CHECKPOINT or row.attempt != attempt)):
            raise NotFound("No such artifact for this job.")
        return row


class UploadOut(serializers.Serializer):
    path = serializers.CharField()
    url = serializers.CharField(help_text="PUT the file here; empty when it goes up in parts")
    headers = serializers.DictField(child=serializers.CharField(), help_text="send these with the PUT")
    part_size = serializers.IntegerField(help_text="> 0: upload in parts of this size (the last may be smaller)")
    parts = serializers.IntegerField()


class ArtifactBeginOut(serializers.Serializer):
    id = serializers.UUIDField()
    uploads = UploadOut(many=True)


class PartIn(serializers.Serializer):
    number = serializers.IntegerField(min_value=1, max_value=10_000)
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$")


class UploadUrlsIn(serializers.Serializer):
    path = serializers.CharField(max_length=1000, validators=[_file_path], trim_whitespace=False)
    parts = PartIn(many=True, required=False, max_length=100)  # type: ignore[call-arg]


class TargetOut(serializers.Serializer):
    number = serializers.IntegerField(help_text="part number; 0 for a whole file")
    url = serializers.CharField()
    headers = serializers.DictField(child=serializers.CharField())
    seconds = serializers.IntegerField(help_text="how long the URL lives")


class UploadUrlsOut(serializers.Serializer):
    path = serializers.CharField()
    targets = TargetOut(many=True)


class DonePartIn(PartIn):
    etag = serializers.CharField(max_length=200)


class PartsDoneIn(serializers.Serializer):
    path = serializers.CharField(max_length=1000, validators=[_file_path], trim_whitespace=False)
    parts = DonePartIn(many=True, max_length=10_000)  # type: ignore[call-arg]


class DownloadUrlIn(serializers.Serializer):
    code = serializers.ChoiceField(choices=["archive", "patch"], required=False)
    input = serializers.CharField(max_length=500, required=False)
    checkpoint = serializers.IntegerField(min_value=1, required=False, help_text="a checkpoint version's number")
    cache = serializers.CharField(required=False, help_text="a cache: path of the job's workflow")
    file = serializers.CharField(max_length=1000, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        with_file = [bool(attrs.get(k) and attrs.get("file")) for k in ("input", "checkpoint", "cache")]
        named = [bool(attrs.get("code")), *with_file]
        if sum(named) != 1:
            raise serializers.ValidationError(
                'Name either "code", or "file" with "input", with "checkpoint" or with "cache".'
            )
        return attrs


class DownloadUrlOut(serializers.Serializer):
    url = serializers.CharField()


class ArtifactCompleteOut(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.CharField()


class RunnerArtifactBeginView(RunnerAPIView):
    @extend_schema(request=ArtifactBeginIn, responses={201: ArtifactBeginOut})
    def post(self, request: Request, job: str) -> Response:
        found = self.runner_job(request, job)
        data = ArtifactBeginIn(data=request.data)
        data.is_valid(raise_exception=True)
        files = [FileIn(**f) for f in data.validated_data["files"]]
        artifact, uploads = artifact_begin(job=found, path=data.validated_data["path"], files=files)
        body = {
            "id": str(artifact.pk),
            "uploads": [
                {"path": u.path, "url": u.url, "headers": u.headers, "part_size": u.part_size, "parts": u.parts}
                for u in uploads
            ],
        }
        return Response(body, status=status.HTTP_201_CREATED)


class RunnerArtifactUploadUrlsView(RunnerAPIView):
    """Fresh upload URLs for one file: the whole file, or a batch of parts."""

    @extend_schema(request=UploadUrlsIn, responses=UploadUrlsOut)
    def post(self, request: Request, job: str, artifact: str) -> Response:
        row = self._artifact(request, job, artifact)
        data = UploadUrlsIn(data=request.data)
        data.is_valid(raise_exception=True)
        path = data.validated_data["path"]
        parts = [(p["number"], p["sha256"]) for p in data.validated_data.get("parts", [])]
        targets = artifact_upload_targets(artifact=row, path=path, parts=parts)
        numbers = [n for n, _ in parts] or [0]
        body = [
            {"number": n, "url": t.url, "headers": t.headers, "seconds": t.seconds}
            for n, t in zip(numbers, targets, strict=True)
        ]
        return Response({"path": path, "targets": body})

    def _artifact(self, request: Request, job: str, artifact: str) -> Artifact:
        return self.runner_checkpoint(request, job, artifact)


class RunnerArtifactPartsView(RunnerArtifactUploadUrlsView):
    """A file uploaded in parts is assembled from them."""

    @extend_schema(request=PartsDoneIn, responses={204: None})
    def post(self, request: Request, job: str, artifact: str) -> Response:
        row = self._artifact(request, job, artifact)
        data = PartsDoneIn(data=request.data)
        data.is_valid(raise_exception=True)
        parts = [Part(p["number"], p["etag"], p["sha256"]) for p in data.validated_data["parts"]]
        artifact_parts_complete(artifact=row, path=data.validated_data["path"], parts=parts)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RunnerDownloadUrlView(RunnerAPIView):
    """A fresh URL for the job's code or one of its input files."""

    @extend_schema(request=DownloadUrlIn, responses=DownloadUrlOut)
    def post(self, request: Request, job: str) -> Response:
        found = self.runner_job(request, job)
        data = DownloadUrlIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        url = job_download_url(
            job=found,
            code=v.get("code", ""),
            input_path=v.get("input", ""),
            file_path=v.get("file", ""),
            checkpoint=v.get("checkpoint", 0),
            cache=v.get("cache", ""),
        )
        return Response({"url": url})


class RunnerArtifactCompleteView(RunnerAPIView):
    @extend_schema(request=None, responses=ArtifactCompleteOut)
    def post(self, request: Request, job: str, artifact: str) -> Response:
        row = self.runner_checkpoint(request, job, artifact)
        if row.kind == ArtifactKind.CACHE:
            saved = cache_complete(saving=row)
            return Response({"id": str(saved.pk), "status": saved.status})
        if row.kind == ArtifactKind.CHECKPOINT:
            done = checkpoint_complete(version=row)
            return Response({"id": str(done.pk), "status": done.status, "number": done.number, "latest": True})
        done = artifact_complete(artifact=row)
        return Response({"id": str(done.pk), "status": done.status})


class CheckpointBeginOut(ArtifactBeginOut):
    number = serializers.IntegerField(help_text="the version's number n (…/checkpoints/<attempt>/<n>/)")
    carried = serializers.IntegerField(help_text="files unchanged since the latest version: not uploaded again")


class RunnerCheckpointBeginView(RunnerAPIView):
    """A new version of the job's checkpoint: the manifest of every file; the
    answer lists only the files to upload. The URL, parts and complete
    endpoints of artifacts finish it (complete makes it the latest)."""

    @extend_schema(request=ArtifactBeginIn, responses={201: CheckpointBeginOut})
    def post(self, request: Request, job: str) -> Response:
        found, _ = self.runner_attempt(request, job, winding_down=True)
        data = ArtifactBeginIn(data=request.data)
        data.is_valid(raise_exception=True)
        files = [FileIn(**f) for f in data.validated_data["files"]]
        attempt = int(request.query_params["attempt"])
        begun = checkpoint_begin(job=found, attempt=attempt, path=data.validated_data["path"], files=files)
        body = {
            "id": str(begun.version.pk),
            "number": begun.version.number,
            "carried": begun.carried,
            "uploads": [
                {"path": u.path, "url": u.url, "headers": u.headers, "part_size": u.part_size, "parts": u.parts}
                for u in begun.uploads
            ],
        }
        return Response(body, status=status.HTTP_201_CREATED)


class RunnerCheckpointDoneView(RunnerAPIView):
    """The runner of an attempt interrupted at a notice made its last
    checkpoint sync: the job's next attempt need not wait for the machine's
    deadline. Idempotent; nothing to do for an attempt that was not held."""

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Request, job: str) -> Response:
        instance, attempt = self.runner_instance_attempt(request)
        attempt_wind_down_end(job_id=job, instance_id=str(instance.pk), attempt=int(attempt))
        return Response(status=status.HTTP_204_NO_CONTENT)


class RunnerCacheBeginView(RunnerAPIView):
    """A new saving of one of the job's ``cache:`` paths: the manifest of
    every file; the answer lists only the files that changed since the
    workspace's latest saving for the workflow. The URL, parts and complete
    endpoints of artifacts finish it."""

    @extend_schema(request=ArtifactBeginIn, responses={201: ArtifactBeginOut})
    def post(self, request: Request, job: str) -> Response:
        found = self.runner_job(request, job)
        data = ArtifactBeginIn(data=request.data)
        data.is_valid(raise_exception=True)
        files = [FileIn(**f) for f in data.validated_data["files"]]
        begun = cache_begin(job=found, attempt=found.attempt, path=data.validated_data["path"], files=files)
        body = {
            "id": str(begun.version.pk),
            "uploads": [
                {"path": u.path, "url": u.url, "headers": u.headers, "part_size": u.part_size, "parts": u.parts}
                for u in begun.uploads
            ],
        }
        return Response(body, status=status.HTTP_201_CREATED)

"""The runner's uploads for the job it holds: artifacts, checkpoint versions
and cache savings (begin, upload URLs, parts, complete), and the end of an
interrupted attempt's checkpoint syncs. The bytes go straight to storage
through signed URLs; these views fence the call (``runner_auth``) and hand
the rest to the artifacts app's services (decision 0005)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from backend.artifacts.caches import cache_begin, cache_complete
from backend.artifacts.checkpoints import checkpoint_begin, checkpoint_complete
from backend.artifacts.models import Artifact, ArtifactKind
from backend.artifacts.services import (
    FileIn,
    artifact_begin,
    artifact_complete,
    artifact_parts_complete,
    artifact_upload_targets,
    path_problem,
)
from backend.artifacts.storage import Part
from backend.core.errors import ApplicationError, NotFound
from backend.runs.api.runner_auth import (
    Held,
    HoldsCurrentOrKeptAttempt,
    HoldsCurrentOrWindingDownAttempt,
    HoldsKeptAttempt,
    HoldsUploadingAttempt,
    NamesAttempt,
    RunnerAPIView,
)
from backend.runs.lifecycle.kept import RUNNER_OUTCOMES, job_kept_end
from backend.runs.lifecycle.transitions import attempt_wind_down_end


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


class ArtifactCompleteOut(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.CharField()


class CheckpointBeginOut(ArtifactBeginOut):
    number = serializers.IntegerField(help_text="the version's number n (…/checkpoints/<attempt>/<n>/)")
    carried = serializers.IntegerField(help_text="files unchanged since the latest version: not uploaded again")


def _uploading(held: Held, artifact_id: str) -> Artifact:
    """An artifact of the held job being uploaded; an attempt winding down
    reaches only its own checkpoint versions, a kept one only artifacts."""
    row = Artifact.stored.filter(pk=artifact_id, job=held.job).first()
    if row is None or (held.winding_down and (row.kind != ArtifactKind.CHECKPOINT or row.attempt != held.attempt)):
        raise NotFound("No such artifact for this job.")
    if held.kept and row.kind != ArtifactKind.OUTPUT:
        raise NotFound("No such artifact for this job.")
    return row


class RunnerArtifactBeginView(RunnerAPIView):
    """One artifact of the job: the manifest of every file. The runner that
    keeps a failed job's files may begin only the job's declared artifacts."""

    permission_classes = [HoldsCurrentOrKeptAttempt]

    @extend_schema(request=ArtifactBeginIn, responses={201: ArtifactBeginOut})
    def post(self, request: Request, job: str) -> Response:
        data = ArtifactBeginIn(data=request.data)
        data.is_valid(raise_exception=True)
        if self.held.kept and data.validated_data["path"] not in self.held.job.spec.get("artifacts", []):
            raise ApplicationError("Only the job's declared artifacts are uploaded from kept files.", status_code=400)
        files = [FileIn(**f) for f in data.validated_data["files"]]
        artifact, uploads = artifact_begin(job=self.held.job, path=data.validated_data["path"], files=files)
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

    permission_classes = [HoldsUploadingAttempt]

    @extend_schema(request=UploadUrlsIn, responses=UploadUrlsOut)
    def post(self, request: Request, job: str, artifact: str) -> Response:
        row = _uploading(self.held, artifact)
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


class RunnerArtifactPartsView(RunnerAPIView):
    """A file uploaded in parts is assembled from them."""

    permission_classes = [HoldsUploadingAttempt]

    @extend_schema(request=PartsDoneIn, responses={204: None})
    def post(self, request: Request, job: str, artifact: str) -> Response:
        row = _uploading(self.held, artifact)
        data = PartsDoneIn(data=request.data)
        data.is_valid(raise_exception=True)
        parts = [Part(p["number"], p["etag"], p["sha256"]) for p in data.validated_data["parts"]]
        artifact_parts_complete(artifact=row, path=data.validated_data["path"], parts=parts)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RunnerArtifactCompleteView(RunnerAPIView):
    permission_classes = [HoldsUploadingAttempt]

    @extend_schema(request=None, responses=ArtifactCompleteOut)
    def post(self, request: Request, job: str, artifact: str) -> Response:
        row = _uploading(self.held, artifact)
        if row.kind == ArtifactKind.CACHE:
            saved = cache_complete(saving=row)
            return Response({"id": str(saved.pk), "status": saved.status})
        if row.kind == ArtifactKind.CHECKPOINT:
            done = checkpoint_complete(version=row)
            return Response({"id": str(done.pk), "status": done.status, "number": done.number, "latest": True})
        done = artifact_complete(artifact=row)
        return Response({"id": str(done.pk), "status": done.status})


class RunnerCheckpointBeginView(RunnerAPIView):
    """A new version of the job's checkpoint: the manifest of every file; the
    answer lists only the files to upload. The URL, parts and complete
    endpoints of artifacts finish it (complete makes it the latest)."""

    permission_classes = [HoldsCurrentOrWindingDownAttempt]

    @extend_schema(request=ArtifactBeginIn, responses={201: CheckpointBeginOut})
    def post(self, request: Request, job: str) -> Response:
        data = ArtifactBeginIn(data=request.data)
        data.is_valid(raise_exception=True)
        files = [FileIn(**f) for f in data.validated_data["files"]]
        held = self.held
        begun = checkpoint_begin(job=held.job, attempt=held.attempt, path=data.validated_data["path"], files=files)
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

    # Scoped by the caller's instance and attempt, not fenced: another runner's call is the same no-op.
    permission_classes = [NamesAttempt]

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Request, job: str) -> Response:
        attempt_wind_down_end(job_id=str(job), instance_id=str(self.call.instance.pk), attempt=self.call.attempt)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RunnerCacheBeginView(RunnerAPIView):
    """A new saving of one of the job's ``cache:`` paths: the manifest of
    every file; the answer lists only the files that changed since the
    workspace's latest saving for the workflow. The URL, parts and complete
    endpoints of artifacts finish it."""

    @extend_schema(request=ArtifactBeginIn, responses={201: ArtifactBeginOut})
    def post(self, request: Request, job: str) -> Response:
        data = ArtifactBeginIn(data=request.data)
        data.is_valid(raise_exception=True)
        files = [FileIn(**f) for f in data.validated_data["files"]]
        found = self.held.job
        begun = cache_begin(job=found, attempt=found.attempt, path=data.validated_data["path"], files=files)
        body = {
            "id": str(begun.version.pk),
            "uploads": [
                {"path": u.path, "url": u.url, "headers": u.headers, "part_size": u.part_size, "parts": u.parts}
                for u in begun.uploads
            ],
        }
        return Response(body, status=status.HTTP_201_CREATED)


class KeptIn(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=RUNNER_OUTCOMES)


class RunnerKeptView(RunnerAPIView):
    """The runner that kept a failed job's files uploaded them as the job's
    artifacts (``uploaded``) or removed them, their time up (``removed``):
    the job's reason says so and its attempt admits no more uploads."""

    permission_classes = [HoldsKeptAttempt]

    @extend_schema(request=KeptIn, responses={204: None})
    def post(self, request: Request, job: str) -> Response:
        data = KeptIn(data=request.data)
        data.is_valid(raise_exception=True)
        job_kept_end(
            job_id=str(job),
            instance_id=str(self.call.instance.pk),
            attempt=self.call.attempt,
            outcome=data.validated_data["outcome"],
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

"""REST endpoints a runner reads for the job it holds: what the assignment
frame does not carry (secrets, input manifests; ``runs.services.delivery``),
fresh download URLs for what it names, and the workspace's packed
environments. Authenticated and fenced by ``runner_auth``: the runner's token
and the ``?attempt=`` that must be the job's current one on that runner."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.core.errors import ApplicationError, NotFound
from backend.runs.api.runner_auth import RunnerAPIView
from backend.runs.lifecycle.dispatch import job_download_url
from backend.runs.services.datainputs import job_data_page, job_data_url
from backend.runs.services.delivery import job_input_page, job_secrets
from backend.runs.services.environments import (
    environment_archive_begin,
    environment_archive_done,
    environment_archive_find,
)


class RunnerCredentialOut(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["https-token", "ssh-key"])
    username = serializers.CharField()
    secret = serializers.CharField()


class JobSecretsOut(serializers.Serializer):
    env = serializers.DictField(child=serializers.CharField(), help_text="the workspace's secrets by name")
    credential = RunnerCredentialOut(allow_null=True, help_text="the repository's clone credential, if one is set")


class InputFileOut(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()
    url = serializers.CharField(help_text="signed GET URL")


class InputPageOut(serializers.Serializer):
    path = serializers.CharField()
    files = InputFileOut(many=True)
    next = serializers.CharField(help_text='the "after" of the next page; "" after the last')


ATTEMPT = OpenApiParameter("attempt", int, required=True, description="the attempt the runner holds")


class RunnerJobSecretsView(RunnerAPIView):
    """The job's secrets and clone credential (runner protocol 3). Never
    cached: the answer is the only place the plaintext leaves the server."""

    @extend_schema(parameters=[ATTEMPT], responses=JobSecretsOut)
    def get(self, request: Request, job: str) -> Response:
        found = job_secrets(job=self.held.job)
        response = Response(found.model_dump(mode="json"))
        response["Cache-Control"] = "no-store"
        return response


class RunnerJobInputsView(RunnerAPIView):
    """One page of the files of one of the job's inputs (runner protocol 3)."""

    @extend_schema(
        parameters=[
            ATTEMPT,
            OpenApiParameter("path", str, required=True, description="the input's path, as in the assignment"),
            OpenApiParameter("after", str, description="the previous page's next; absent for the first page"),
        ],
        responses=InputPageOut,
    )
    def get(self, request: Request, job: str) -> Response:
        found = self.held.job
        path = request.query_params.get("path", "")
        if not path:
            raise ApplicationError("Say which input: ?path=<its path in the assignment>.", extra={"field": "path"})
        page = job_input_page(job=found, path=path, after=request.query_params.get("after", ""))
        return Response(page.model_dump(mode="json"))


class DownloadUrlOut(serializers.Serializer):
    url = serializers.CharField()


class DataFileOut(serializers.Serializer):
    path = serializers.CharField(help_text='relative to the input\'s path; "" for a one-file input')
    size = serializers.IntegerField()
    url = serializers.CharField(help_text="GET URL (presigned for s3://, pinned to the listed version)")
    etag = serializers.CharField()
    sha256 = serializers.CharField()
    identity = serializers.CharField(help_text="what the machine's cache keeps the bytes under")


class DataPageOut(serializers.Serializer):
    path = serializers.CharField()
    files = DataFileOut(many=True)
    next = serializers.CharField(help_text='the "after" of the next page; "" after the last')


class RunnerJobDataView(RunnerAPIView):
    """One page (at most 1,000 files) of one of the job's data inputs, as
    listed at submission (runner protocol 7)."""

    @extend_schema(
        parameters=[
            ATTEMPT,
            OpenApiParameter("path", str, required=True, description="the data input's path, as in the assignment"),
            OpenApiParameter("after", str, description="the previous page's next; absent for the first page"),
        ],
        responses=DataPageOut,
    )
    def get(self, request: Request, job: str) -> Response:
        path = request.query_params.get("path", "")[:1024]
        if not path:
            raise ApplicationError("Say which input: ?path=<its path in the assignment>.", extra={"field": "path"})
        after = request.query_params.get("after", "")[:2048]
        page = job_data_page(job=self.held.job, path=path, after=after)
        response = Response(page.model_dump(mode="json"))
        response["Cache-Control"] = "no-store"
        return response


class DataUrlIn(serializers.Serializer):
    path = serializers.CharField(max_length=1024, help_text="the data input's path, as in the assignment")
    file = serializers.CharField(max_length=2048, allow_blank=True, help_text="the file's path within it")


class RunnerJobDataUrlView(RunnerAPIView):
    """A fresh URL for one file of a data input, after its presigned URL expired."""

    @extend_schema(parameters=[ATTEMPT], request=DataUrlIn, responses=DownloadUrlOut)
    def post(self, request: Request, job: str) -> Response:
        data = DataUrlIn(data=request.data)
        data.is_valid(raise_exception=True)
        url = job_data_url(job=self.held.job, path=data.validated_data["path"], file=data.validated_data["file"])
        response = Response({"url": url})
        response["Cache-Control"] = "no-store"
        return response


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


class RunnerDownloadUrlView(RunnerAPIView):
    """A fresh URL for the job's code or one of its input files."""

    @extend_schema(request=DownloadUrlIn, responses=DownloadUrlOut)
    def post(self, request: Request, job: str) -> Response:
        data = DownloadUrlIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        url = job_download_url(
            job=self.held.job,
            code=v.get("code", ""),
            input_path=v.get("input", ""),
            file_path=v.get("file", ""),
            checkpoint=v.get("checkpoint", 0),
            cache=v.get("cache", ""),
        )
        return Response({"url": url})


# ------------------------------------------------------------ environments (docs/ENVIRONMENTS.md)


class EnvironmentKeyIn(serializers.Serializer):
    key = serializers.RegexField(r"^[0-9a-f]{24}$", help_text="the environment's key")


class EnvironmentPackedIn(EnvironmentKeyIn):
    size = serializers.IntegerField(min_value=1, help_text="bytes of the packed environment")
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$")


class EnvironmentArchiveOut(serializers.Serializer):
    url = serializers.CharField(help_text="signed GET URL of the packed environment")
    size = serializers.IntegerField()
    sha256 = serializers.CharField()


class EnvironmentUploadOut(serializers.Serializer):
    url = serializers.CharField(
        allow_null=True, help_text="signed PUT URL; null when it is stored already or another runner uploads it"
    )
    headers = serializers.DictField(child=serializers.CharField(), help_text="to send with the PUT")


class RunnerEnvironmentView(RunnerAPIView):
    """The workspace's packed environment of a key: GET it to restore, POST
    to pack one this runner built."""

    @extend_schema(
        parameters=[ATTEMPT, OpenApiParameter("key", str, required=True, description="the environment's key")],
        responses=EnvironmentArchiveOut,
    )
    def get(self, request: Request, job: str) -> Response:
        found = self.held.job
        data = EnvironmentKeyIn(data={"key": request.query_params.get("key", "")})
        data.is_valid(raise_exception=True)
        target = environment_archive_find(job=found, key=data.validated_data["key"])
        if target is None:
            raise NotFound("No packed environment of this key in the workspace's storage.")
        return Response({"url": target.url, "size": target.size, "sha256": target.sha256})

    @extend_schema(parameters=[ATTEMPT], request=EnvironmentPackedIn, responses=EnvironmentUploadOut)
    def post(self, request: Request, job: str) -> Response:
        found = self.held.job
        data = EnvironmentPackedIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        target = environment_archive_begin(job=found, key=v["key"], size=v["size"], sha256=v["sha256"])
        return Response({"url": target.url, "headers": target.headers} if target else {"url": None, "headers": {}})


class RunnerEnvironmentDoneView(RunnerAPIView):
    """The upload of a packed environment finished: checked, then offered to other runners."""

    @extend_schema(parameters=[ATTEMPT], request=EnvironmentKeyIn, responses={204: None})
    def post(self, request: Request, job: str) -> Response:
        found = self.held.job
        data = EnvironmentKeyIn(data=request.data)
        data.is_valid(raise_exception=True)
        problem = environment_archive_done(job=found, key=data.validated_data["key"])
        if problem:
            raise ApplicationError(problem[:1].upper() + problem[1:] + ".", status_code=409)
        return Response(status=204)

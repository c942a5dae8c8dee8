"""REST endpoints a runner reads for the job it holds: what the assignment
frame does not carry (secrets, input manifests; ``runs.services.delivery``).
Authenticated like the artifact endpoints: the runner's token and the
``?attempt=`` that must be the job's current one on that runner."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from backend.artifacts.api import RunnerAPIView
from backend.core.errors import ApplicationError
from backend.runs.services.delivery import job_input_page, job_secrets


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
        found = job_secrets(job=self.runner_job(request, job))
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
        found = self.runner_job(request, job)
        path = request.query_params.get("path", "")
        if not path:
            raise ApplicationError("Say which input: ?path=<its path in the assignment>.", extra={"field": "path"})
        page = job_input_page(job=found, path=path, after=request.query_params.get("after", ""))
        return Response(page.model_dump(mode="json"))

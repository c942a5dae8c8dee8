"""REST views for runs, jobs' logs and code blobs: parse, check, call, serialise."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.auth import signed_in_user
from backend.accounts.models import Role
from backend.accounts.tenancy import WorkspaceAPIView
from backend.artifacts.models import Blob
from backend.artifacts.services import blob_create
from backend.core.errors import ApplicationError, NotFound
from backend.core.pagination import PageNumberPagination, RawBodyParser
from backend.runs.api.serializers import (
    BlobOut,
    LogPageOut,
    RunCreateIn,
    RunOut,
    RunPlanIn,
    RunPlanOut,
    TagIn,
    TagOut,
)
from backend.runs.models import Run, Tag
from backend.runs.selectors import job_get, job_log_lines, run_get, run_list
from backend.runs.services.placement import run_offer_plan
from backend.runs.services.preview import code_identity_of, run_plan_preview
from backend.runs.services.runs import CodeInput, PlanInputs, plan_inputs, run_create, run_rerun, run_stop
from backend.runs.services.tags import tag_delete, tag_set

MAX_LOG_PAGE = 10_000


class RunListView(WorkspaceAPIView):
    pagination_class = PageNumberPagination

    @extend_schema(
        responses=RunOut(many=True),
        parameters=[
            OpenApiParameter("status", str),
            OpenApiParameter("workflow", str),
            OpenApiParameter("q", str, description="search in name, workflow and submitter"),
            OpenApiParameter("tag", str),
        ],
    )
    def get(self, request: Request, workspace: str) -> Response:
        params = request.query_params
        runs = run_list(
            workspace=self.workspace,
            status=params.get("status", ""),
            workflow=params.get("workflow", ""),
            q=params.get("q", "").strip()[:100],
            tag=params.get("tag", ""),
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(runs, request, view=self)
        return paginator.get_paginated_response(RunOut(page, many=True).data)

    @extend_schema(request=RunCreateIn, responses={201: RunOut})
    def post(self, request: Request, workspace: str) -> Response:
        data = RunCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        code = v["code"]
        run = run_create(
            workspace=self.workspace,
            user=signed_in_user(request),
            workflow=v["workflow"],
            inputs=_plan_inputs(v),
            code=CodeInput(
                kind=code["kind"],
                repo_url=code["repo_url"],
                commit=code["commit"],
                patch_blob=str(code["patch_blob"]) if code["patch_blob"] else None,
                archive_blob=str(code["archive_blob"]) if code["archive_blob"] else None,
            ),
            no_cache=v["no_cache"],
            placement=dict(v["placement"]),
        )
        # The plan table `trainyard run` prints: each job's cheapest offer now.
        answer = {**RunOut(_fresh(run)).data, "plan": run_offer_plan(run=run)}
        return Response(answer, status=status.HTTP_201_CREATED)


class RunPlanView(WorkspaceAPIView):
    """A dry run: the plan (jobs, deps, inputs, cache hits); nothing is written."""

    write_role = Role.VIEWER

    @extend_schema(request=RunPlanIn, responses=RunPlanOut)
    def post(self, request: Request, workspace: str) -> Response:
        data = RunPlanIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        code = v["code"]
        identity = code_identity_of(
            workspace=self.workspace,
            kind=code["kind"],
            commit=code["commit"],
            patch_sha256=code["patch_sha256"] or _blob_sha(self.workspace, code["patch_blob"]),
            archive_sha256=code["archive_sha256"] or _blob_sha(self.workspace, code["archive_blob"]),
        )
        plan = run_plan_preview(
            workspace=self.workspace,
            workflow=v["workflow"],
            inputs=_plan_inputs(v),
            code_identity=identity,
            no_cache=v["no_cache"],
            placement=dict(v["placement"]),
        )
        return Response(plan)


class TagListView(WorkspaceAPIView):
    @extend_schema(responses=TagOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        tags = Tag.objects.for_workspace(self.workspace).select_related("run", "created_by").order_by("name")
        return Response(TagOut(tags, many=True).data)

    @extend_schema(request=TagIn, responses={201: TagOut, 200: TagOut})
    def post(self, request: Request, workspace: str) -> Response:
        data = TagIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        tag, outcome = tag_set(
            workspace=self.workspace,
            user=signed_in_user(request),
            name=v["name"],
            run=_run_or_404(self.workspace, v["run"]),
            force=v["force"],
        )
        return Response(TagOut(tag).data, status=201 if outcome == "created" else 200)


class TagDetailView(WorkspaceAPIView):
    @extend_schema(responses=TagOut)
    def get(self, request: Request, workspace: str, name: str) -> Response:
        tag = Tag.objects.for_workspace(self.workspace).select_related("run", "created_by").filter(name=name).first()
        if tag is None:
            raise NotFound(f"Tag {name!r} not found.")
        return Response(TagOut(tag).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, workspace: str, name: str) -> Response:
        if not tag_delete(workspace=self.workspace, name=name):
            raise NotFound(f"Tag {name!r} not found.")
        return Response(status=204)


class RunDetailView(WorkspaceAPIView):
    @extend_schema(responses=RunOut)
    def get(self, request: Request, workspace: str, run: str) -> Response:
        return Response(RunOut(_run_or_404(self.workspace, run)).data)


class RunRerunView(WorkspaceAPIView):
    @extend_schema(request=None, responses={201: RunOut})
    def post(self, request: Request, workspace: str, run: str) -> Response:
        again = run_rerun(run=_run_or_404(self.workspace, run), user=signed_in_user(request))
        return Response(RunOut(_fresh(again)).data, status=status.HTTP_201_CREATED)


class RunStopView(WorkspaceAPIView):
    @extend_schema(request=None, responses={202: RunOut})
    def post(self, request: Request, workspace: str, run: str) -> Response:
        stopped = run_stop(run=_run_or_404(self.workspace, run), user=signed_in_user(request))
        return Response(RunOut(_fresh(stopped)).data, status=status.HTTP_202_ACCEPTED)


class JobLogsView(WorkspaceAPIView):
    serializer_class = LogPageOut

    @extend_schema(
        responses=LogPageOut, parameters=[OpenApiParameter("after_seq", int), OpenApiParameter("limit", int)]
    )
    def get(self, request: Request, workspace: str, job: str) -> Response:
        found = job_get(workspace=self.workspace, job_id=job)
        if found is None:
            raise NotFound("Job not found.")
        after = _int_param(request, "after_seq", 0, minimum=0)
        limit = min(_int_param(request, "limit", 1000, minimum=1), MAX_LOG_PAGE)
        rows = job_log_lines(job=found, after_seq=after, limit=limit + 1)
        lines = [{"seq": s, "ts": ts, "stream": st, "text": t} for s, ts, st, t in rows[:limit]]
        return Response({"job": str(found.pk), "lines": lines, "has_more": len(rows) > limit})


class BlobCreateView(WorkspaceAPIView):
    @extend_schema(request={"application/octet-stream": bytes}, responses={201: BlobOut})
    def post(self, request: Request, workspace: str) -> Response:
        blob = blob_create(workspace=self.workspace, user=signed_in_user(request), chunks=_chunks(request))
        return Response(BlobOut(blob).data, status=201)

    parser_classes = [RawBodyParser]


def _plan_inputs(v: dict[str, Any]) -> PlanInputs:
    return plan_inputs(
        files=v["files"],
        env=v["env"],
        inherited_env=v["inherited_env"],
        run_args=v["run_args"],
        variables=v["variables"],
    )


def _blob_sha(workspace: object, blob_id: object) -> str:
    if not blob_id:
        return ""
    blob = Blob.objects.for_workspace(workspace).filter(pk=blob_id).first()  # type: ignore[arg-type]
    if blob is None:
        raise ApplicationError(f"Blob {blob_id} is not a blob of this workspace.")
    return blob.sha256


def _chunks(request: Request) -> Iterator[bytes]:
    while chunk := request._request.read(1 << 20):
        yield chunk


def _run_or_404(workspace: object, ref: str) -> Run:
    run = run_get(workspace=workspace, ref=ref)  # type: ignore[arg-type]
    if run is None:
        raise NotFound(f"Run {ref!r} not found.")
    return run


def _fresh(run: Run) -> Run:
    return Run.objects.select_related("submitted_by").prefetch_related("jobs").get(pk=run.pk)


def _int_param(request: Request, name: str, default: int, *, minimum: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApplicationError(f"{name} must be a whole number, not {raw!r}.") from None
    if value < minimum:
        raise ApplicationError(f"{name} must be at least {minimum}.")
    return value

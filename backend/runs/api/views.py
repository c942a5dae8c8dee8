"""REST views for runs, jobs' logs and code blobs: parse, check, call, serialise."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpResponse, HttpResponseBase, HttpResponseRedirect, StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from backend.accounts.auth import signed_in_user
from backend.accounts.models import Role, Workspace
from backend.accounts.tenancy import WorkspaceAPIView
from backend.artifacts.models import Blob
from backend.artifacts.services import blob_create
from backend.billing.services import amount_parse
from backend.core.errors import ApplicationError, NotFound
from backend.core.pagination import RawBodyParser
from backend.core.ratelimit import client_ip
from backend.runs.api.listing import run_shown, run_snapshot, runs_shown
from backend.runs.api.serializers import (
    BlobOut,
    EnvironmentDetailOut,
    EnvironmentOut,
    LineageOut,
    LogPageOut,
    LogSearchOut,
    NamesOut,
    RerunOut,
    RunCreateIn,
    RunDetailOut,
    RunPageOut,
    RunPlanIn,
    RunPlanOut,
    RunSourceOut,
    TagIn,
    TagOut,
)
from backend.runs.events import publish_runs, publishing_held
from backend.runs.models import Environment, Job, Run, Tag, run_ref_missing
from backend.runs.selectors import (
    NAME_KINDS,
    environment_get,
    environment_list,
    environment_runs,
    job_get,
    names_list,
    run_by_ref,
    run_get,
    run_list,
    run_page,
)
from backend.runs.services.budgets import run_resume_if_budget_stopped
from backend.runs.services.datainputs import rerun_notices
from backend.runs.services.lineage import DEFAULT_DEPTH, MAX_DEPTH, lineage_shown, run_lineage
from backend.runs.services.logwindow import LogWindow, log_lines_after, log_lines_before, log_search
from backend.runs.services.offerplan import run_estimate, run_offer_plan
from backend.runs.services.preview import code_facts_of, run_plan_preview
from backend.runs.services.rawlog import (
    ByteRange,
    RangeNotSatisfiable,
    RawLogRange,
    raw_log_archive_url,
    raw_log_byte_range,
    raw_log_bytes,
    raw_log_chunks,
)
from backend.runs.services.runs import CodeInput, PlanInputs, plan_inputs, run_create, run_rerun, run_stop
from backend.runs.services.sources import run_sources
from backend.runs.services.submissions import once_of, run_submit
from backend.runs.services.tags import tag_delete, tag_set

MAX_LOG_PAGE = 10_000
PAGE_SIZE = 50  # runs per page of the list (page_size: at most MAX_PAGE_SIZE)
MAX_PAGE_SIZE = 500


class RunListView(WorkspaceAPIView):
    # Keyset pages, newest first: ``next`` carries an opaque ``cursor``
    # (docs/API.md, "Pagination"); ``count`` is exact up to
    # ``RUNS_EXACT_COUNT_UP_TO``, else estimated and ``count_estimated`` says so.
    throttle_scopes = {"POST": "run"}

    @extend_schema(
        operation_id="workspaces_runs_list",
        responses=RunPageOut,
        parameters=[
            OpenApiParameter("status", str),
            OpenApiParameter("workflow", str),
            OpenApiParameter("q", str, description="search in name, workflow and submitter"),
            OpenApiParameter("tag", str),
            OpenApiParameter("mine", int, description="1: only the runs the caller submitted"),
            OpenApiParameter("cursor", str, description="the `next` link's cursor of the previous page"),
            OpenApiParameter("page_size", int, description="runs per page (default 50, at most 500)"),
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
            submitted_by=signed_in_user(request) if _flag(request, "mine") else None,
        )
        size = min(_int_param(request, "page_size", PAGE_SIZE, minimum=1), MAX_PAGE_SIZE)
        page = run_page(runs=runs, cursor=params.get("cursor", ""), size=size)
        return Response(
            {
                "count": page.count,
                "count_estimated": page.count_estimated,
                "next": _with_cursor(request, page.next) if page.next else None,
                "previous": None,
                # RunOut's shape, without DRF's nested serializers (listing.py).
                "results": runs_shown(page.rows),
            }
        )

    @extend_schema(
        request=RunCreateIn,
        responses={201: RunDetailOut},
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="names this submission: sent again with the same body within 24 hours, it answers "
                "with the run the first one made (header Idempotent-Replayed: true) instead of making another; "
                "with another body, 422",
            )
        ],
    )
    def post(self, request: Request, workspace: str) -> Response:
        data = RunCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        code = v["code"]
        user = signed_in_user(request)
        once = once_of(header=request.headers.get("Idempotency-Key"), body=request.data)
        max_cost = amount_parse("max_cost", v["max_cost"], nullable=True)

        def create() -> Run:
            return run_create(
                workspace=self.workspace,
                user=user,
                workflow=v["workflow"],
                inputs=_plan_inputs(v),
                code=CodeInput(
                    kind=code["kind"],
                    repo_url=code["repo_url"],
                    commit=code["commit"],
                    patch_blob=str(code["patch_blob"]) if code["patch_blob"] else None,
                    archive_blob=str(code["archive_blob"]) if code["archive_blob"] else None,
                    patch_files=code["patch_files"],
                ),
                no_cache=v["no_cache"],
                placement=dict(v["placement"]),
                environment_build=v["environment_build"],
                once=once,
                max_cost=max_cost,
                queue=v["queue"],
                budget_override=v["budget_override"],
                address=client_ip(request),
            )

        # The snapshot of the answer is the one its followers are sent: read once.
        with publishing_held() as changed:
            submitted = run_submit(workspace=self.workspace, user=user, once=once, create=create)
        run = submitted.run
        shown = run_snapshot(run)
        publish_runs(changed, shown=(run, shown))
        # The plan table `trainyard run` prints: each job's cheapest offer now, its and the run's estimate.
        answer = {**shown, "plan": run_offer_plan(run=run), "estimate": run_estimate(run=run)}
        headers = {"Idempotent-Replayed": "true"} if submitted.replayed else None
        return Response(answer, status=status.HTTP_201_CREATED, headers=headers)


class RunPlanView(WorkspaceAPIView):
    """A dry run: the plan (jobs, deps, inputs, cache hits); nothing is written."""

    write_role = Role.VIEWER
    throttle_scopes = {"POST": "plan"}

    @extend_schema(request=RunPlanIn, responses=RunPlanOut)
    def post(self, request: Request, workspace: str) -> Response:
        data = RunPlanIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        code = v["code"]
        facts = code_facts_of(
            kind=code["kind"],
            commit=code["commit"],
            patch_sha256=code.get("patch_sha256") or _blob_sha(self.workspace, code["patch_blob"]),
            archive_sha256=code.get("archive_sha256") or _blob_sha(self.workspace, code["archive_blob"]),
            patch_files=code["patch_files"],
        )
        plan = run_plan_preview(
            workspace=self.workspace,
            workflow=v["workflow"],
            inputs=_plan_inputs(v),
            code=facts,
            repo_url=code["repo_url"],
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


class EnvironmentListView(WorkspaceAPIView):
    @extend_schema(responses=EnvironmentOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        return Response(EnvironmentOut(environment_list(workspace=self.workspace), many=True).data)


class EnvironmentDetailView(WorkspaceAPIView):
    @extend_schema(responses=EnvironmentDetailOut)
    def get(self, request: Request, workspace: str, key: str) -> Response:
        found = _environment_or_404(self.workspace, key)
        names = environment_runs(workspace=self.workspace, key=key)
        return Response(EnvironmentDetailOut(found, context={"recent_runs": names}).data)


class EnvironmentLockView(WorkspaceAPIView):
    """The lock as a file: what ``uv pip sync`` (or ``pip install
    --require-hashes -r``) installs to get the environment's packages again."""

    @extend_schema(responses={(200, "text/plain"): bytes})
    def get(self, request: Request, workspace: str, key: str) -> HttpResponseBase:
        found = _environment_or_404(self.workspace, key)
        response = HttpResponse(found.lock, content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="environment-{found.key}.lock.txt"'
        return response


def _environment_or_404(workspace: Workspace, key: str) -> Environment:
    found = environment_get(workspace=workspace, key=key)
    if found is None:
        raise NotFound(f"Environment {key!r} not found in this workspace.")
    return found


class NamesView(WorkspaceAPIView):
    """Names that start with a prefix, for shell completion (``trainyard completion``)."""

    @extend_schema(
        operation_id="workspaces_names_list",
        responses=NamesOut,
        parameters=[
            OpenApiParameter("kind", str, enum=list(NAME_KINDS), required=True),
            OpenApiParameter("prefix", str, description="only names that start with this (at most 100 characters)"),
        ],
    )
    def get(self, request: Request, workspace: str) -> Response:
        kind = request.query_params.get("kind", "")
        if kind not in NAME_KINDS:
            raise ApplicationError(f"kind must be one of {', '.join(NAME_KINDS)}, not {kind[:40]!r}.")
        prefix = request.query_params.get("prefix", "")
        if len(prefix) > 100:
            raise ApplicationError("prefix must be at most 100 characters.")
        return Response({"names": names_list(workspace=self.workspace, kind=kind, prefix=prefix)})


class RunDetailView(WorkspaceAPIView):
    @extend_schema(responses=RunDetailOut)
    def get(self, request: Request, workspace: str, run: str) -> Response:
        shown = run_shown(run_by_ref(workspace=self.workspace, ref=run))
        if shown is None:
            raise NotFound(run_ref_missing(run))
        return Response(shown)


class RunSourceListView(WorkspaceAPIView):
    """What a new run may start from: per repository, its last submitted run's code and workflows files."""

    @extend_schema(responses=RunSourceOut(many=True))
    def get(self, request: Request, workspace: str) -> Response:
        return Response(run_sources(workspace=self.workspace))


class RunLineageView(WorkspaceAPIView):
    """The runs and tags that fed a run and the runs that used its artifacts (docs/RUNS.md, "Lineage")."""

    @extend_schema(
        responses=LineageOut,
        parameters=[
            OpenApiParameter("depth", int, description=f"steps each way (default {DEFAULT_DEPTH}, 1 to {MAX_DEPTH})")
        ],
    )
    def get(self, request: Request, workspace: str, run: str) -> Response:
        depth = _int_param(request, "depth", DEFAULT_DEPTH, minimum=1)
        if depth > MAX_DEPTH:
            raise ApplicationError(f"depth must be between 1 and {MAX_DEPTH}.")
        found = _run_or_404(self.workspace, run)
        return Response(lineage_shown(run_lineage(run=found, depth=depth)))


class RunRerunView(WorkspaceAPIView):
    throttle_scopes = {"POST": "run"}

    @extend_schema(request=None, responses={201: RerunOut, 200: RerunOut})
    def post(self, request: Request, workspace: str, run: str) -> Response:
        """A new run of the same workflow (201); a run the budget stopped
        resumes in place from its checkpoints instead (200, ``resumed``)."""
        original = _run_or_404(self.workspace, run)
        resumed = run_resume_if_budget_stopped(original)
        if resumed:
            return Response({**run_snapshot(original), "notices": [], "resumed": resumed}, status=status.HTTP_200_OK)
        again = run_rerun(run=original, user=signed_in_user(request))
        notices = rerun_notices(again)
        return Response({**run_snapshot(again), "notices": notices, "resumed": []}, status=status.HTTP_201_CREATED)


class RunStopView(WorkspaceAPIView):
    @extend_schema(request=None, responses={202: RunDetailOut})
    def post(self, request: Request, workspace: str, run: str) -> Response:
        stopped = run_stop(run=_run_or_404(self.workspace, run), user=signed_in_user(request))
        return Response(run_snapshot(stopped), status=status.HTTP_202_ACCEPTED)


class JobLogsView(WorkspaceAPIView):
    """A page of the job's lines, a window of them, or where a search matches (docs/LOGS.md)."""

    serializer_class = LogPageOut

    @staticmethod
    def throttle_scope_of(request: Request) -> str | None:
        """A search reads up to TRAINYARD_LOG_SEARCH_BYTES: counted (``logsearch``); a page is not."""
        return "logsearch" if request.method == "GET" and "search" in request.query_params else None

    @extend_schema(
        responses={200: PolymorphicProxySerializer("LogPageOrSearch", [LogPageOut, LogSearchOut], None)},
        parameters=[
            OpenApiParameter("after_seq", int, description="the lines after this seq (default 0)"),
            OpenApiParameter("before_seq", int, description="the last `limit` lines before this seq"),
            OpenApiParameter("tail", int, description="the last N lines of the log"),
            OpenApiParameter("limit", int, description=f"at most this many lines (default 1000, max {MAX_LOG_PAGE})"),
            OpenApiParameter("search", str, description="the seq of the nearest line containing this text instead"),
            OpenApiParameter("from_seq", int, description="search from this seq (included)"),
            OpenApiParameter("direction", str, enum=["next", "prev"], description="search forward or backward"),
        ],
    )
    def get(self, request: Request, workspace: str, job: str) -> Response:
        found = job_get(workspace=self.workspace, job_id=job)
        if found is None:
            raise NotFound("Job not found.")
        max_bytes = settings.TRAINYARD["LOG_PAGE_BYTES"]
        if request.query_params.get("search") is not None:
            return Response(self._search(request, found, max_bytes))
        window = _log_window(request, found, max_bytes)
        lines = [{"seq": s, "ts": ts, "stream": st, "text": t} for s, ts, st, t in window.lines]
        return Response({"job": str(found.pk), "lines": lines, "has_more": window.has_more, "last_seq": found.last_seq})

    @staticmethod
    def _search(request: Request, job: Job, max_bytes: int) -> dict[str, Any]:
        text = request.query_params.get("search", "")
        if not text.strip():
            raise ApplicationError("search must not be empty.")
        direction = request.query_params.get("direction", "next")
        if direction not in ("next", "prev"):
            raise ApplicationError(f"direction must be next or prev, not {direction!r}.")
        default = 1 if direction == "next" else max(job.last_seq, 1)
        start = _int_param(request, "from_seq", default, minimum=1)
        found = log_search(
            job=job,
            text=text,
            from_seq=start,
            direction=direction,  # type: ignore[arg-type]
            max_bytes=max_bytes,
            budget_bytes=settings.TRAINYARD["LOG_SEARCH_BYTES"],
        )
        return {
            "job": str(job.pk),
            "seq": found.seq,
            "last_seq": job.last_seq,
            "partial": found.partial,
            "searched_to": found.searched_to,
        }


class JobRawLogView(WorkspaceAPIView):
    """The job's log as plain text, streamed (docs/LOGS.md, "Raw read-back")."""

    throttle_scopes = {"GET": "rawlog"}

    @extend_schema(
        responses={(200, "text/plain"): bytes, (206, "text/plain"): bytes, 302: None, 416: None},
        parameters=[
            OpenApiParameter("from_seq", int, description="first seq to include (default 1)"),
            OpenApiParameter("to_seq", int, description="last seq to include (default: the end)"),
            OpenApiParameter("tail", int, description="only the last N lines of the range"),
            OpenApiParameter("timestamps", int, description="1: each line starts with its UTC time and a space"),
            OpenApiParameter(
                "download",
                int,
                description="1: sent as an attachment with a file name; the whole archived log of a job that ran "
                "once answers 302 to its object in storage (a short-lived URL)",
            ),
        ],
    )
    def get(self, request: Request, workspace: str, job: str) -> HttpResponseBase:
        found = job_get(workspace=self.workspace, job_id=job)
        if found is None:
            raise NotFound("Job not found.")
        wanted = RawLogRange(
            from_seq=_int_param(request, "from_seq", 1, minimum=1),
            to_seq=_optional_int(request, "to_seq", minimum=0),
            tail=_optional_int(request, "tail", minimum=0),
            timestamps=_flag(request, "timestamps"),
        )
        filename = f"{found.run.name}-{found.name}.log"
        if _flag(request, "download"):
            # An archived log is its object in storage: the client fetches it there.
            url = raw_log_archive_url(job=found, wanted=wanted, filename=filename)
            if url is not None:
                return HttpResponseRedirect(url)
        try:
            part = _byte_range(request, found) if wanted == RawLogRange() else None
        except RangeNotSatisfiable as e:
            message = f"The range starts past the end of the log ({e.total} bytes)."
            return Response(
                {"message": message, "extra": {"size": e.total}},
                status=416,
                headers={"Content-Range": f"bytes */{e.total}"},
            )
        if part is not None:
            response = StreamingHttpResponse(_streamed(raw_log_bytes(job=found, wanted=part)), status=206)
            response["Content-Range"] = f"bytes {part.start}-{part.end - 1}/{part.total}"
            response["Content-Length"] = str(part.end - part.start)
        else:
            response = StreamingHttpResponse(_streamed(raw_log_chunks(job=found, wanted=wanted)))
        response["Content-Type"] = "text/plain; charset=utf-8"
        response["Cache-Control"] = "no-store"
        if _flag(request, "download"):
            response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response


class BlobCreateView(WorkspaceAPIView):
    throttle_scopes = {"POST": "blob"}

    @extend_schema(request={"application/octet-stream": bytes}, responses={201: BlobOut})
    def post(self, request: Request, workspace: str) -> Response:
        length = request.META.get("CONTENT_LENGTH") or ""
        blob = blob_create(
            workspace=self.workspace,
            user=signed_in_user(request),
            chunks=_chunks(request),
            declared=int(length) if length.isdigit() else None,
        )
        return Response(BlobOut(blob).data, status=201)

    parser_classes = [RawBodyParser]


def _plan_inputs(v: dict[str, Any]) -> PlanInputs:
    return plan_inputs(
        files=v["files"],
        env=v["env"],
        inherited_env=v["inherited_env"],
        run_args=v["run_args"],
        variables=v["variables"],
        environment_files=v["environment_files"],
        resources=dict(v["resources"]),
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
        raise NotFound(run_ref_missing(ref))
    return run


def _with_cursor(request: Request, cursor: str) -> str:
    """This request's URL (filters, page size) with ``cursor`` set."""
    params = request.query_params.copy()
    params["cursor"] = cursor
    params.pop("page", None)
    return request.build_absolute_uri(f"{request.path}?{params.urlencode()}")


def _byte_range(request: Request, job: Job) -> ByteRange | None:
    """The ``Range: bytes=`` the request asks of the whole log, if any
    applies (docs/LOGS.md, "Raw read-back")."""
    header = request.headers.get("Range", "")
    return raw_log_byte_range(job=job, header=header) if header else None


def _log_window(request: Request, job: Job, max_bytes: int) -> LogWindow:
    """after_seq, before_seq or tail (one of them) with limit."""
    given = [name for name in ("after_seq", "before_seq", "tail") if request.query_params.get(name) not in (None, "")]
    if len(given) > 1:
        raise ApplicationError(f"Give one of after_seq, before_seq and tail, not {' and '.join(given)}.")
    if "tail" in given:
        tail = min(_int_param(request, "tail", 0, minimum=0), MAX_LOG_PAGE)
        if tail == 0:
            return LogWindow([], False)
        return log_lines_before(job=job, before_seq=None, limit=tail, max_bytes=max_bytes)
    limit = min(_int_param(request, "limit", 1000, minimum=1), MAX_LOG_PAGE)
    if "before_seq" in given:
        before = _int_param(request, "before_seq", 0, minimum=1)
        return log_lines_before(job=job, before_seq=before, limit=limit, max_bytes=max_bytes)
    after = _int_param(request, "after_seq", 0, minimum=0)
    return log_lines_after(job=job, after_seq=after, limit=limit, max_bytes=max_bytes)


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


def _optional_int(request: Request, name: str, *, minimum: int) -> int | None:
    if request.query_params.get(name) in (None, ""):
        return None
    return _int_param(request, name, 0, minimum=minimum)


def _flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "")
    if raw not in ("", "0", "1"):
        raise ApplicationError(f"{name} must be 0 or 1, not {raw!r}.")
    return raw == "1"


async def _streamed(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` (which query the database) stepped in Django's sync thread:
    an async iterator, so the ASGI server streams it instead of Django
    collecting a sync iterator whole first."""
    step = sync_to_async(_next_or_none)
    while (chunk := await step(chunks)) is not None:
        if chunk:
            yield chunk


def _next_or_none(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)

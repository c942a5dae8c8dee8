"""The Python SDK: a typed client of the Trainyard REST API (docs/API.md).

    from trainyard.api import Client
    client = Client("http://127.0.0.1:8000", token="trainyard_…")
    run = client.get_run("brave-otter-1")

Every failure is an ``ApiError`` whose ``message`` a person can act on (the
server's own message when it sent one); ``ServerUnreachable`` when nothing
answers. Every call has a timeout.
"""

from __future__ import annotations

import hashlib
import io
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, BinaryIO, Required, TypeAlias, TypedDict, Unpack, cast
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import httpx

from . import __version__, apitypes

TIMEOUT = httpx.Timeout(30.0, connect=5.0)
TRANSFER_TIMEOUT = httpx.Timeout(300.0, connect=5.0)  # blobs and artifact files
NAMES_TIMEOUT = httpx.Timeout(2.0, connect=1.0)  # shell completion's one request
# A run is named by its name, ``tag:NAME`` or ``WORKFLOW@latest`` (the server resolves them).
TAG_PREFIX = "tag:"
LATEST_SUFFIX = "@latest"
FINISHED = ("succeeded", "failed", "stopped")
# Retries (docs/CLI.md, "The network"): a request that got no answer or a
# 5xx is asked again after each of these seconds (with up to a quarter more
# at random, so many clients do not come back at once), when asking twice
# does no harm: GET, HEAD, PUT, DELETE, and a POST that carries an
# Idempotency-Key. A connection that was never made is asked again after
# CONNECT_RETRY_WAITS, whatever the method: nothing was sent.
RETRY_WAITS = (0.5, 1.0, 2.0, 4.0, 8.0)
CONNECT_RETRY_WAITS = (0.25, 0.5, 1.0)
# A 429 or 503 waits what its Retry-After says (at most MAX_RATE_WAIT_SECONDS
# each time); a 429 is asked again whatever the method (the server did nothing).
MAX_RATE_WAIT_SECONDS = 60.0
RATE_RETRIES = 5
# All the waiting of one request together, at most: past it the last error stands.
MAX_TOTAL_WAIT_SECONDS = 120.0
REPEATABLE_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


# The SDK's names of the API's objects. Their fields are the schema's
# (frontend/openapi.yaml): ``apitypes`` is generated from it.
Run: TypeAlias = apitypes.RunOut
Job: TypeAlias = apitypes.JobOut
CacheDecision: TypeAlias = apitypes.CacheDecisionOut
RunPage: TypeAlias = apitypes.RunPageOut
Plan: TypeAlias = apitypes.RunPlanOut
PlannedJob: TypeAlias = apitypes.PlannedJobOut
LogLine: TypeAlias = apitypes.LogLineOut
LogPage: TypeAlias = apitypes.LogPageOut
Artifact: TypeAlias = apitypes.ArtifactOut
Export: TypeAlias = apitypes.ExportOut
ArtifactFile: TypeAlias = apitypes.ArtifactFileOut
WorkflowsFileText: TypeAlias = apitypes.WorkflowsFileInRequest
Environment: TypeAlias = apitypes.EnvironmentDetailOut
EnvironmentSummary: TypeAlias = apitypes.EnvironmentOut
Tag: TypeAlias = apitypes.TagOut
Secret: TypeAlias = apitypes.SecretOut
Budgets: TypeAlias = apitypes.BudgetsOut
BudgetRow: TypeAlias = apitypes.BudgetOut
Subscription: TypeAlias = apitypes.SubscriptionOut
SubscriptionCreated: TypeAlias = apitypes.SubscriptionCreatedOut
Delivery: TypeAlias = apitypes.DeliveryOut
Volume: TypeAlias = apitypes.VolumeOut
ApiToken: TypeAlias = apitypes.TokenOut
NewApiToken: TypeAlias = apitypes.TokenCreatedOut
SshKey: TypeAlias = apitypes.SshKeyOut
RepoCredential: TypeAlias = apitypes.CredentialOut
Blob: TypeAlias = apitypes.BlobOut
Backend: TypeAlias = apitypes.BackendOut
AwsSetup: TypeAlias = apitypes.AwsSetupOut
Offers: TypeAlias = apitypes.OffersOut
Instance: TypeAlias = apitypes.InstanceOut
SelfHostedRunner: TypeAlias = apitypes.SelfHostedRunnerOut
Me: TypeAlias = apitypes.MeOut
ServerInfo: TypeAlias = apitypes.Health
RunMetrics: TypeAlias = apitypes.RunMetricsOut
CostReport: TypeAlias = apitypes.CostReportOut
JobMetrics: TypeAlias = apitypes.JobMetricsOut
JobSeries: TypeAlias = apitypes.JobSeriesOut
MetricSeries: TypeAlias = apitypes.MetricSeriesOut
Comparison: TypeAlias = apitypes.CompareOut
GuardDefaults: TypeAlias = apitypes.GuardDefaultsOut
DataEndpoint: TypeAlias = apitypes.DataEndpointOut
Rerun: TypeAlias = apitypes.RerunOut


class RunSubmission(TypedDict, total=False):
    """The keyword arguments of ``create_run`` and ``plan_run`` besides
    ``code``: the workflow, its files and what it is run with (docs/API.md).
    ``workflows_file_path`` and ``_text`` name one file instead of
    ``workflows_files``; ``environment_files``: {requirements file: {path:
    sha256}} (``trainyard_spec.environments``)."""

    workflow: Required[str]
    workflows_files: list[WorkflowsFileText]
    workflows_file_path: str
    workflows_file_text: str
    env: dict[str, str]
    inherited_env: dict[str, str]
    run_args: list[str]
    variables: dict[str, dict[str, str]]
    no_cache: bool
    placement: dict[str, Any]
    # Keys of resources: that replace every workflow's ({"gpu": "A10G:2", "memory": "16GB"}).
    resources: dict[str, Any]
    environment_files: dict[str, dict[str, str]]
    # Budgets (docs/COST.md): the run's own cap in USD, wait for budget instead of a refusal, an admin's override.
    max_cost: str
    queue: bool
    budget_override: bool


class ApiError(Exception):
    """A request failed. ``errors`` holds workflow-file errors from a 400
    (``{"file", "line", "key", "message"}`` each)."""

    def __init__(self, message: str, *, status: int | None = None, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.errors = errors or []


class Conflict(ApiError):
    """409: the object exists (a tag that points to another run)."""


class ServerUnreachable(ApiError):
    """Nothing answered at the server's URL."""


class Client:
    """One workspace of one Trainyard server. ``workspace=None`` uses the
    caller's default workspace (asked once, from ``me()``)."""

    def __init__(
        self,
        url: str,
        token: str,
        workspace: str | None = None,
        *,
        timeout: httpx.Timeout = TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._workspace = workspace
        headers = {"Authorization": f"Bearer {token}", "User-Agent": f"trainyard-cli/{__version__}"}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def workspace(self) -> str:
        if self._workspace is None:
            default = self.me()["default_workspace"]
            if default is None:
                raise ApiError("you are a member of no workspace: create one in the web app, or ask to be added to one")
            self._workspace = default
        return self._workspace

    def me(self) -> Me:
        return cast(Me, self._request("GET", "/api/v1/me/"))

    def server_info(self) -> ServerInfo:
        """The server's status and limits (no token needed)."""
        return cast(ServerInfo, self._request("GET", "/api/v1/health/"))

    def upload_blob(self, data: bytes | Path, *, on_bytes: Callable[[int], None] | None = None) -> Blob:
        """Upload code (a tar.gz or a patch); a Path is streamed from disk.
        ``on_bytes``: called with the count of each part sent (negative when
        a retry sends it again from the start)."""
        if isinstance(data, Path):
            with data.open("rb") as f:
                size = data.stat().st_size
                return cast(Blob, self._blob(_Counted(f, on_bytes) if on_bytes else f, size))
        if on_bytes:
            return cast(Blob, self._blob(_Counted(io.BytesIO(data), on_bytes), len(data)))
        return cast(Blob, self._blob(data, len(data)))

    def rerun(self, name: str) -> Rerun:
        """A new run of the same workflow, code and values; ``notices``: what it reads
        differently (a data input whose bucket keeps no versions)."""
        return cast(Rerun, self._request("POST", self._ws(f"runs/{quote(name, safe='')}/rerun/")))

    def create_run(
        self,
        *,
        code: dict[str, Any],
        environment_build: bool = False,
        idempotency_key: str | None = None,
        **submission: Unpack[RunSubmission],
    ) -> Run:
        """Submit a run of ``workflow`` from ``workflows_files``.
        ``inherited_env``: values of the workflows' bare env names;
        ``run_args``: ``${{ run.args }}``; ``variables``: per workflow,
        ``${{ variables.NAME }}``. ``no_cache``: run every job even if an
        earlier run's artifacts could be reused. ``placement``: overrides of
        every workflow's ``backends``, ``regions``, ``spot_policy``,
        ``max_price``. ``environment_files``: the digests of the
        environments' requirements files. ``environment_build``: only build
        the workflow's environment (``trainyard env build``).
        ``idempotency_key``: names this submission (default: a new one); a
        timeout, a lost connection or a 5xx is tried again with it
        (``RETRY_WAITS``), which makes no second run (docs/API.md)."""
        body = _run_body(code, submission) | ({"environment_build": True} if environment_build else {})
        # One key for this submission and every retry of it: a retry whose
        # first copy did make a run is answered with that run.
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        return cast(Run, self._request("POST", self._ws("runs/"), json=body, headers=headers))

    def plan_run(self, *, code: dict[str, Any], **submission: Unpack[RunSubmission]) -> Plan:
        """What ``create_run`` would do, submitting nothing. ``code`` may carry
        ``patch_sha256``/``archive_sha256`` instead of blob ids (``code.code_digests``)."""
        url, body = self._ws("runs/plan/"), _run_body(code, submission)
        return cast(Plan, self._request("POST", url, json=body, repeatable=True))

    def list_runs(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        tag: str | None = None,
        mine: bool = False,
        cursor: str | None = None,
        page_size: int = 20,
    ) -> RunPage:
        """One page of runs, newest first; ``cursor``: the previous page's
        ``next`` cursor. ``status``: comma-separated; ``mine``: only the
        caller's runs."""
        given = {"status": status, "workflow": workflow, "tag": tag, "mine": 1 if mine else None}
        params = {k: v for k, v in {**given, "cursor": cursor, "page_size": page_size}.items() if v is not None}
        return cast(RunPage, self._request("GET", self._ws("runs/"), params=params))

    def iter_runs(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        tag: str | None = None,
        mine: bool = False,
        page_size: int = 100,
    ) -> Iterator[Run]:
        """Every run, newest first, page by page (each page from the previous one's cursor)."""
        cursor = None
        while True:
            result = self.list_runs(
                status=status, workflow=workflow, tag=tag, mine=mine, cursor=cursor, page_size=page_size
            )
            yield from result["results"]
            cursor = _cursor_of(result.get("next"))
            if cursor is None or not result["results"]:
                return

    def names(self, kind: str, prefix: str = "") -> list[str]:
        """At most 50 of the workspace's names of ``kind`` (run, workflow, tag,
        environment) that start with ``prefix``: what shell completion offers.
        Asked once, within NAMES_TIMEOUT and never retried: a Tab must not wait."""
        params = {"kind": kind, "prefix": prefix}
        with self._guard():
            response = self._http.get(self._ws("names/"), params=params, timeout=NAMES_TIMEOUT)
        if response.status_code >= 400:
            raise _error_from(response)
        return [str(name) for name in response.json()["names"]]

    def get_run(self, name: str) -> Run:
        return cast(Run, self._request("GET", self._ws(f"runs/{quote(name, safe='')}/")))

    def stop_run(self, name: str) -> Run:
        return cast(Run, self._request("POST", self._ws(f"runs/{quote(name, safe='')}/stop/")))

    def job_logs(self, job: str, *, after_seq: int = 0, limit: int = 1000, tail: int | None = None) -> LogPage:
        """A page of the job's lines after ``after_seq``, or (``tail``) its last ``tail`` lines."""
        params = {"tail": tail} if tail is not None else {"after_seq": after_seq, "limit": limit}
        return cast(LogPage, self._request("GET", self._ws(f"jobs/{quote(job, safe='')}/logs/"), params=params))

    def iter_job_logs(self, job: str, *, after_seq: int = 0, limit: int = 10000) -> Iterator[list[LogLine]]:
        """Pages of a job's stored lines after ``after_seq``, until the end."""
        while True:
            page = self.job_logs(job, after_seq=after_seq, limit=limit)
            if page["lines"]:
                yield page["lines"]
                after_seq = page["lines"][-1]["seq"]
            if not page["has_more"] or not page["lines"]:
                return

    def job_raw_log(
        self, job: str, out: BinaryIO, *, prefix: str = "", window: Mapping[str, int] | None = None
    ) -> None:
        """Stream a job's log as plain text (``…/logs/raw``) into ``out``,
        each line starting with ``prefix``: the whole log, or the part
        ``window`` asks for (``from_seq``, ``to_seq``, ``tail``, ``timestamps``: 1)."""
        # download=1: an archived log comes from its object in storage (a redirect).
        query = urlencode({"download": 1, **(window or {})})
        url = self._ws(f"jobs/{quote(job, safe='')}/logs/raw") + f"?{query}"
        marker, start = prefix.encode(), True
        for chunk in self._download(url):
            if marker and chunk:
                chunk, start = _prefixed(chunk, marker, start)
            out.write(chunk)

    def cost_report(self, *, since: str | None, until: str | None, by: str) -> CostReport:
        """The workspace's costs over a window, grouped (docs/API.md, "Costs")."""
        params = {k: v for k, v in {"since": since, "until": until, "by": by}.items() if v}
        return cast(CostReport, self._request("GET", self._ws("costs/"), params=params))

    def budgets(self) -> Budgets:
        """The workspace's budgets and what each counted this month (docs/API.md, "Budgets")."""
        return cast(Budgets, self._request("GET", self._ws("budgets/")))

    def set_budget(self, user: str | None, body: Mapping[str, Any]) -> BudgetRow:
        """Set the workspace's budget (``user`` None) or a member's; keys left out keep their value."""
        return cast(BudgetRow, self._request("PUT", self._ws(_budget_path(user)), json=dict(body)))

    def remove_budget(self, user: str | None) -> None:
        self._request("DELETE", self._ws(_budget_path(user)))

    def run_metrics(self, run: str) -> RunMetrics:
        """Each job's series names, last values and counters (docs/API.md, "Metrics")."""
        return cast(RunMetrics, self._request("GET", self._ws(f"runs/{quote(run, safe='')}/metrics/")))

    def job_series(
        self,
        run: str,
        job: str,
        *,
        names: list[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        points: int | None = None,
    ) -> JobSeries:
        """One job's series over its attempts, at most ``points`` each (the server's default: 1000)."""
        params: dict[str, Any] = {"job": job}
        if names:
            params["names"] = ",".join(names)
        for key, value in (("since", since), ("until", until), ("points", points)):
            if value is not None:
                params[key] = value
        url = self._ws(f"runs/{quote(run, safe='')}/metrics/series/")
        return cast(JobSeries, self._request("GET", url, params=params))

    def compare_runs(self, runs: list[str], *, names: list[str] | None = None) -> Comparison:
        params = {"runs": ",".join(runs), **({"names": ",".join(names)} if names else {})}
        return cast(Comparison, self._request("GET", self._ws("metrics/compare/"), params=params))

    def list_artifacts(self, run: str) -> list[Artifact]:
        return cast(list[Artifact], self._request("GET", self._ws(f"runs/{quote(run, safe='')}/artifacts/")))

    def list_exports(self, run: str) -> list[Export]:
        """The copies of the run's artifacts to their ``to:`` (a reused job's too)."""
        return cast(list[Export], self._request("GET", self._ws(f"runs/{quote(run, safe='')}/exports/")))

    def download_artifact_file(self, artifact_id: str, path: str, out: BinaryIO) -> tuple[int, str]:
        """Stream one file into ``out`` (following the redirect to its signed
        URL); returns (bytes written, sha256 hex) for checking."""
        digest, size = hashlib.sha256(), 0
        for chunk in self._download(self._artifact_file_url(artifact_id, path)):
            out.write(chunk)
            digest.update(chunk)
            size += len(chunk)
        return size, digest.hexdigest()

    def fetch_artifact_file(
        self, artifact_id: str, path: str, partial: Path, *, on_bytes: Callable[[int], None] | None = None
    ) -> tuple[int, str, int]:
        """Download one file into ``partial``, continuing after the bytes
        already there (``Range``; a server that sends the whole file instead
        starts it over), also when the connection breaks midway (asked again
        from where it broke, up to len(RETRY_WAITS) times). Returns (its size,
        the sha256 of the whole file, the bytes it continued after).
        ``on_bytes``: called with the count of each part written (negative
        when it starts over)."""
        url, count = self._artifact_file_url(artifact_id, path), on_bytes or (lambda n: None)
        digest, broken = hashlib.sha256(), 0
        with partial.open("a+b") as out:  # appends; the bytes there already are read for the digest
            out.seek(0)
            while block := out.read(1 << 20):
                digest.update(block)
            have = resumed = out.tell()
            while True:
                try:
                    for offset, chunk in self._stream(url, start=have):
                        if offset == 0 and have:
                            out.truncate(0)
                            digest, resumed = hashlib.sha256(), 0
                            count(-have)
                            have = 0
                        out.write(chunk)
                        digest.update(chunk)
                        have += len(chunk)
                        count(len(chunk))
                    return have, digest.hexdigest(), resumed
                except ApiError as error:
                    if error.status is not None or broken >= len(RETRY_WAITS):
                        raise
                    time.sleep(_jittered(RETRY_WAITS[broken]))
                    broken += 1
                    out.flush()

    def _artifact_file_url(self, artifact_id: str, path: str) -> str:
        return self._ws(f"artifacts/{quote(artifact_id, safe='')}/files/{quote(path)}")

    def add_tag(self, name: str, run: str, *, force: bool = False) -> tuple[Tag, bool]:
        """Point tag ``name`` at ``run``: (the tag, whether it moved from
        another run). Conflict (409) if it points elsewhere and not ``force``."""
        status, body = self._request_status("POST", self._ws("tags/"), json={"name": name, "run": run, "force": force})
        return cast(Tag, body), status == 200

    def list_environments(self) -> list[EnvironmentSummary]:
        return cast(list[EnvironmentSummary], self._request("GET", self._ws("environments/")))

    def get_environment(self, key: str) -> Environment:
        return cast(Environment, self._request("GET", self._ws(f"environments/{quote(key, safe='')}/")))

    def list_tags(self) -> list[Tag]:
        return cast(list[Tag], self._request("GET", self._ws("tags/")))

    def remove_tag(self, name: str) -> None:
        self._request("DELETE", self._ws(f"tags/{quote(name, safe='')}/"))

    def set_secret(self, name: str, value: str) -> Secret:
        """Create or replace a secret; runs get it as env ``name`` and their
        logs show it as *****."""
        return cast(Secret, self._request("PUT", self._ws(f"secrets/{quote(name, safe='')}/"), json={"value": value}))

    def create_volume(self, body: Mapping[str, str]) -> Volume:
        return cast(Volume, self._request("POST", self._ws("volumes/"), json=dict(body)))

    def list_volumes(self) -> list[Volume]:
        return cast(list[Volume], self._request("GET", self._ws("volumes/")))

    def delete_volume(self, name: str) -> None:
        self._request("DELETE", self._ws(f"volumes/{quote(name, safe='')}/"))

    def list_secrets(self) -> list[Secret]:
        return cast(list[Secret], self._request("GET", self._ws("secrets/")))

    def remove_secret(self, name: str) -> None:
        self._request("DELETE", self._ws(f"secrets/{quote(name, safe='')}/"))

    def create_notification(self, body: Mapping[str, Any]) -> SubscriptionCreated:
        """A new subscription; a webhook's ``secret`` is in this answer only."""
        return cast(SubscriptionCreated, self._request("POST", self._ws("notifications/"), json=dict(body)))

    def list_notifications(self) -> list[Subscription]:
        return cast(list[Subscription], self._request("GET", self._ws("notifications/")))

    def remove_notification(self, subscription_id: str) -> None:
        self._request("DELETE", self._ws(f"notifications/{quote(subscription_id, safe='')}/"))

    def test_notification(self, subscription_id: str) -> Delivery:
        """Queue a ``test`` event for the subscription; its delivery."""
        return cast(Delivery, self._request("POST", self._ws(f"notifications/{quote(subscription_id, safe='')}/test/")))

    def notification_deliveries(self, subscription_id: str) -> list[Delivery]:
        url = self._ws(f"notifications/{quote(subscription_id, safe='')}/deliveries/")
        return cast(list[Delivery], self._request("GET", url))

    def guard_defaults(self) -> GuardDefaults:
        """The workspace's default guards (``stall``, ``utilization_policy``;
        null where there is none), as a workflow writes them."""
        return cast(GuardDefaults, self._request("GET", self._ws("guards/")))

    def set_guard_defaults(self, defaults: Mapping[str, Any]) -> GuardDefaults:
        """Replace the workspace's default guards (admins only); a key left
        out or null is no default. Runs submitted from now on get them."""
        return cast(GuardDefaults, self._request("PUT", self._ws("guards/"), json=dict(defaults)))

    def data_endpoint(self) -> DataEndpoint:
        """The workspace's S3-compatible endpoint for ``s3://`` inputs (never its secret)."""
        return cast(DataEndpoint, self._request("GET", self._ws("data/endpoint/")))

    def set_data_endpoint(
        self, endpoint_url: str, *, region: str = "", access_key_id: str = "", secret_access_key: str = ""
    ) -> DataEndpoint:
        """Set the workspace's S3-compatible endpoint (admins only)."""
        body = {
            "endpoint_url": endpoint_url,
            "region": region,
            "access_key_id": access_key_id,
            "secret_access_key": secret_access_key,
        }
        return cast(DataEndpoint, self._request("PUT", self._ws("data/endpoint/"), json=body))

    def remove_data_endpoint(self) -> None:
        self._request("DELETE", self._ws("data/endpoint/"))

    def create_token(self, name: str, *, expires_in: str = "") -> NewApiToken:
        """A new API token of the caller (``expires_in``: 30d, 12h, …, never; empty: the
        server's default). Shown once."""
        body = {"name": name, "expires_in": expires_in}
        return cast(NewApiToken, self._request("POST", "/api/v1/tokens/", json=body))

    def list_tokens(self) -> list[ApiToken]:
        return cast(list[ApiToken], self._request("GET", "/api/v1/tokens/"))

    def revoke_token(self, token_id: str) -> None:
        self._request("DELETE", f"/api/v1/tokens/{quote(token_id, safe='')}/")

    def list_ssh_keys(self) -> list[SshKey]:
        """The caller's SSH public keys (a person's, not a workspace's)."""
        return cast(list[SshKey], self._request("GET", "/api/v1/me/ssh-keys/"))

    def add_ssh_key(self, public_key: str, *, name: str = "") -> SshKey:
        """Registers one OpenSSH public key line (``name``: else the key's comment)."""
        body = {"public_key": public_key, "name": name}
        return cast(SshKey, self._request("POST", "/api/v1/me/ssh-keys/", json=body))

    def remove_ssh_key(self, ref: str) -> None:
        """Removes the caller's key named by its id, fingerprint (SHA256:…) or name."""
        self._request("DELETE", f"/api/v1/me/ssh-keys/{quote(ref, safe=':')}/")

    def create_session(self, run: str, *, kind: str, job: str | None = None, port: int | None = None) -> dict[str, Any]:
        """A grant to open a session into a running job (docs/ACCESS.md):
        ``token`` and ``url`` of the client websocket (connect within a
        minute), ``host_alias`` and ``host_key`` for ssh."""
        body: dict[str, Any] = {"kind": kind, **({"job": job} if job else {}), **({"port": port} if port else {})}
        return cast(dict[str, Any], self._request("POST", self._ws(f"runs/{quote(run, safe='')}/sessions/"), json=body))

    def set_repo_credential(self, url: str, *, kind: str, secret: str, username: str = "") -> RepoCredential:
        """Set (or replace) the credential runners clone ``url`` with."""
        body = {"url": url, "kind": kind, "secret": secret, "username": username}
        return cast(RepoCredential, self._request("PUT", self._ws("repos/credential/"), json=body))

    def remove_repo_credential(self, url: str) -> None:
        self._request("DELETE", self._ws(f"repos/credential/?url={quote(url, safe='')}"))

    def list_backends(self) -> list[Backend]:
        return cast(list[Backend], self._request("GET", self._ws("backends/")))

    def aws_setup(self, *, bucket: str = "", data_bucket: str = "", output_bucket: str = "") -> AwsSetup:
        """The workspace's external id and the policies its AWS role needs
        (with the named buckets' statements for those given)."""
        named = {"bucket": bucket, "data_bucket": data_bucket, "output_bucket": output_bucket}
        params = {k: v for k, v in named.items() if v}
        return cast(AwsSetup, self._request("GET", self._ws("backends/aws/setup/"), params=params))

    def add_backend(self, body: dict[str, Any]) -> Backend:
        """Connect an account (``{"kind": "aws", ...}``); the server checks it
        for real first and answers its message when a check fails."""
        return cast(Backend, self._request("POST", self._ws("backends/"), json=body, timeout=TRANSFER_TIMEOUT))

    def validate_backend(self, name: str) -> Backend:
        url = self._ws(f"backends/{quote(name, safe='')}/validate/")
        return cast(Backend, self._request("POST", url, timeout=TRANSFER_TIMEOUT))

    def remove_backend(self, name: str) -> None:
        self._request("DELETE", self._ws(f"backends/{quote(name, safe='')}/"))

    def offers(self, **filters: str) -> Offers:
        """Offers of the workspace's accounts, cheapest first; filters: gpu,
        memory, cpu, spot_policy, region, backend."""
        params = {k: v for k, v in filters.items() if v}
        return cast(Offers, self._request("GET", self._ws("offers/"), params=params))

    def list_instances(self, *, all_: bool = False) -> list[Instance]:
        params = {"all": "1"} if all_ else {}
        return cast(list[Instance], self._request("GET", self._ws("instances/"), params=params))

    def terminate_instance(self, name: str) -> Instance:
        """Terminate the workspace's machine ``name`` (admins): terminating
        until the backend confirms. A self-hosted one is revoked instead."""
        url = self._ws(f"instances/{quote(name, safe='')}/terminate/")
        return cast(Instance, self._request("POST", url, repeatable=True))

    def revoke_runner(self, runner_id: str) -> None:
        """Revoke a self-hosted machine (admins): its token is refused from now on."""
        self._request("POST", self._ws(f"runners/{quote(runner_id, safe='')}/revoke/"), repeatable=True)

    def list_runners(self) -> list[SelfHostedRunner]:
        """The workspace's self-hosted machines, revoked ones last."""
        return cast(list[SelfHostedRunner], self._request("GET", self._ws("runners/")))

    def set_runner_price(self, runner_id: str, price_per_hour: str) -> SelfHostedRunner:
        """Set a self-hosted machine's price per hour (USD; admins)."""
        url = self._ws(f"runners/{quote(runner_id, safe='')}/")
        return cast(SelfHostedRunner, self._request("PATCH", url, json={"price_per_hour": price_per_hour}))

    def ws_url(self, run: str, *, after_seq: int = 0) -> str:
        """The run's websocket URL (http→ws, https→wss)."""
        base = "ws" + self.url[len("http") :] if self.url.startswith("http") else self.url
        query = urlencode({"after_seq": after_seq})
        return f"{base}/ws/v1/workspaces/{quote(self.workspace, safe='')}/runs/{quote(run, safe='')}/?{query}"

    # ------------------------------------------------------------ private

    def _ws(self, rest: str) -> str:
        return f"/api/v1/workspaces/{quote(self.workspace, safe='')}/{rest}"

    def _blob(self, content: bytes | BinaryIO | _Counted, size: int) -> Any:
        # An explicit Content-Length keeps httpx from chunking a file upload.
        # Asking twice is harmless: a second copy is a blob no run names, which the storage sweep removes.
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        url = self._ws("blobs/")
        return self._request("POST", url, content=content, headers=headers, timeout=TRANSFER_TIMEOUT, repeatable=True)

    def _download(self, url: str) -> Iterator[bytes]:
        """The body of a GET of ``url`` in chunks of 1 MiB (``_stream``)."""
        for _, chunk in self._stream(url):
            yield chunk

    def _stream(self, url: str, *, start: int = 0) -> Iterator[tuple[int, bytes]]:
        """The body of a GET of ``url`` in chunks of 1 MiB, each with its
        offset in the whole body, following redirects (a file's signed URL in
        storage), retried as ``_request`` retries until its first byte (a 429
        of the download rate limit waits its ``Retry-After``). ``start``:
        from that byte on (``Range``); a server that sends the whole body
        instead starts at offset 0."""
        headers = {"Range": f"bytes={start}-"} if start else {}
        retry, started = _Retry(repeatable=True), False
        while True:
            try:
                with (
                    self._guard(),
                    self._http.stream(
                        "GET", url, follow_redirects=True, timeout=TRANSFER_TIMEOUT, headers=headers
                    ) as r,
                ):
                    if r.status_code >= 400:
                        r.read()
                        error = _error_from(r)
                        wait = retry.after_answer(error, r)
                        if wait is None:
                            raise error
                    else:
                        started = True
                        offset = start if start and r.status_code == 206 else 0
                        for chunk in r.iter_bytes(1 << 20):
                            yield offset, chunk
                            offset += len(chunk)
                        return
            except ApiError as error:
                if error.status is not None or started:
                    raise
                wait = retry.after_failure(error)
                if wait is None:
                    raise
            time.sleep(wait)

    def _request(self, method: str, url: str, **kwargs: Any) -> Any:
        return self._request_status(method, url, **kwargs)[1]

    def _request_status(
        self, method: str, url: str, *, repeatable: bool | None = None, **kwargs: Any
    ) -> tuple[int, Any]:
        """One call, retried when that is safe (``RETRY_WAITS``, ``Retry-After``);
        ``repeatable``: asking twice does no harm (default: by the method, or an
        Idempotency-Key)."""
        if repeatable is None:
            repeatable = method in REPEATABLE_METHODS or "Idempotency-Key" in (kwargs.get("headers") or {})
        retry = _Retry(repeatable=repeatable)
        while True:
            content = kwargs.get("content")
            if content is not None and hasattr(content, "seek"):
                content.seek(0)  # a file body is sent again from its start
            try:
                with self._guard():
                    response = self._http.request(method, url, **kwargs)
            except ApiError as failure:
                wait = retry.after_failure(failure)
                if wait is None:
                    raise
                time.sleep(wait)
                continue
            if response.status_code < 400:
                break
            error = _error_from(response)
            wait = retry.after_answer(error, response)
            if wait is None:
                raise error
            time.sleep(wait)
        if response.status_code == 204 or not response.content:
            return response.status_code, None
        try:
            return response.status_code, response.json()
        except ValueError:
            raise ApiError(
                f"the server answered {method} {url} with something that is not JSON (HTTP {response.status_code})",
                status=response.status_code,
            ) from None

    def _guard(self) -> AbstractContextManager[None]:
        return _transport_errors(self.url)


@contextmanager
def _transport_errors(url: str) -> Iterator[None]:
    """Turns httpx transport failures into ApiError / ServerUnreachable."""
    try:
        yield
    except httpx.ConnectError:
        raise ServerUnreachable(f"cannot reach Trainyard at {url}: is the server running (make run)?") from None
    except httpx.TimeoutException as e:
        raise ApiError(f"Trainyard at {url} did not answer in time ({type(e).__name__})") from None
    except httpx.TransportError as e:
        raise ApiError(f"connection to Trainyard at {url} failed: {e}") from None


class _Counted:
    """A file sent as a request's body, each read counted on ``on_bytes``;
    ``seek`` (a retry sends it again) takes back what was counted."""

    def __init__(self, file: BinaryIO, on_bytes: Callable[[int], None]) -> None:
        self._file, self._on_bytes, self._sent = file, on_bytes, 0

    def read(self, size: int = -1) -> bytes:
        chunk = self._file.read(size)
        self._sent += len(chunk)
        self._on_bytes(len(chunk))
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        self._on_bytes(-self._sent)
        self._sent = 0
        return self._file.seek(offset, whence)

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read(1 << 16):
            yield chunk


class _Retry:
    """The retries of one request: how long to wait before the next, or None
    when it is not to be asked again (not safe to repeat, or the retries or
    their total wait are spent)."""

    def __init__(self, *, repeatable: bool) -> None:
        self.repeatable = repeatable
        self.failures = 0
        self.rate_limited = 0
        self.waited = 0.0

    def after_failure(self, error: ApiError) -> float | None:
        """No answer: a connection never made (any method), or one lost or timed out (a repeatable request)."""
        never_sent = isinstance(error, ServerUnreachable)
        waits = CONNECT_RETRY_WAITS if never_sent else RETRY_WAITS
        if not (never_sent or self.repeatable) or self.failures >= len(waits):
            return None
        self.failures += 1
        return self._spend(_jittered(waits[self.failures - 1]))

    def after_answer(self, error: ApiError, response: httpx.Response) -> float | None:
        status = response.status_code
        said = _retry_after(response)
        if status == 429 or (status == 503 and said is not None and self.repeatable):
            if self.rate_limited >= RATE_RETRIES:
                return None
            self.rate_limited += 1
            return self._spend(said if said is not None else _jittered(RETRY_WAITS[0]))
        if status >= 500 and self.repeatable and self.failures < len(RETRY_WAITS):
            self.failures += 1
            return self._spend(_jittered(RETRY_WAITS[self.failures - 1]))
        return None

    def _spend(self, wait: float) -> float | None:
        if self.waited + wait > MAX_TOTAL_WAIT_SECONDS:
            return None
        self.waited += wait
        return wait


def _jittered(seconds: float) -> float:
    return seconds * (1 + random.random() / 4)


def _retry_after(response: httpx.Response) -> float | None:
    """The seconds ``Retry-After`` says to wait (a number of seconds or an
    HTTP date), at most MAX_RATE_WAIT_SECONDS; None without one."""
    text = response.headers.get("Retry-After", "").strip()
    if text.isdigit():
        return min(float(text), MAX_RATE_WAIT_SECONDS)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return min(max((when - datetime.now(UTC)).total_seconds(), 0.0), MAX_RATE_WAIT_SECONDS)


def _error_from(response: httpx.Response) -> ApiError:
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message") or body.get("detail"), str):
        extra = body.get("extra")
        listed = extra.get("errors") if isinstance(extra, dict) else None
        errors = listed if isinstance(listed, list) else []
        message = body.get("message") or body["detail"]
    else:
        errors, message = (
            [],
            f"HTTP {status} from {response.request.method} {response.request.url.path}: {response.text[:200].strip()}",
        )
    if status == 401:
        message += " (check TRAINYARD_TOKEN, or run `trainyard login`)"
    return (Conflict if status == 409 else ApiError)(message, status=status, errors=errors)


def _run_body(code: dict[str, Any], submission: RunSubmission) -> dict[str, Any]:
    # One file goes as workflows_file, which servers from before
    # workflows_files understand too; the optional keys only when they have values.
    files = submission.get("workflows_files") or [
        {"path": submission.get("workflows_file_path", ""), "text": submission.get("workflows_file_text", "")}
    ]
    body: dict[str, Any] = {"workflow": submission["workflow"]}
    body |= {"workflows_file": dict(files[0])} if len(files) == 1 else {"workflows_files": [dict(f) for f in files]}
    body |= {"code": code, "env": submission.get("env") or {}, "no_cache": submission.get("no_cache", False)}
    optional = {
        "inherited_env": submission.get("inherited_env"),
        "run_args": submission.get("run_args"),
        "variables": submission.get("variables"),
        "placement": submission.get("placement"),
        "resources": submission.get("resources"),
        "environment_files": submission.get("environment_files"),
        "max_cost": submission.get("max_cost"),
        "queue": submission.get("queue"),
        "budget_override": submission.get("budget_override"),
    }
    return body | {k: v for k, v in optional.items() if v}


def _budget_path(user: str | None) -> str:
    return f"budgets/{quote(user, safe='')}/" if user else "budgets/workspace/"


def _cursor_of(link: str | None) -> str | None:
    """The ``cursor`` of a ``next`` link (None: no next page)."""
    if not link:
        return None
    found = parse_qs(urlsplit(link).query).get("cursor")
    return found[0] if found else None


def _prefixed(chunk: bytes, prefix: bytes, start: bool) -> tuple[bytes, bool]:
    """``chunk`` with ``prefix`` at the start of each line in it (``start``:
    the chunk begins a line), and whether the next chunk begins one: a bytes
    replace, not a loop over lines."""
    body = chunk.replace(b"\n", b"\n" + prefix)
    if chunk.endswith(b"\n"):
        body = body[: -len(prefix)]
    return (prefix + body if start else body), chunk.endswith(b"\n")

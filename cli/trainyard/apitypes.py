"""The REST API's types: generated from frontend/openapi.yaml by
datamodel-code-generator (cli/scripts/gen_apitypes.py), never edited by hand.
`make cli-api-types` regenerates it; tests/cli/test_apitypes.py fails while it and
the schema disagree. trainyard.api names the ones the SDK returns."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal, NotRequired, TypeAlias, TypedDict


class ArtifactCompleteOut(TypedDict):
    id: str
    status: str


class ArtifactDifferenceOut(TypedDict):
    job: str
    path: str
    """
    the artifact's path (./model)
    """
    files: list[str]
    """
    a few of the files changed, added or missing (sorted)
    """
    more_files: int
    """
    how many other files differ
    """
    only_in: str
    """
    "the re-run" or "the original" when only one side has the artifact; else ""
    """
    text: str
    """
    in words: "train ./model (model.bin)"
    """


class ArtifactFileOut(TypedDict):
    path: str
    size: int
    sha256: str


ArtifactOutStatusEnum: TypeAlias = Literal["uploading", "complete"]
"""
* `uploading` - Uploading
* `complete` - Complete
"""


AttemptOutStatusEnum: TypeAlias = Literal["assigned", "running", "stopping", "ended"]
"""
* `assigned` - Assigned
* `running` - Running
* `stopping` - Stopping
* `ended` - Ended
"""


AuditEventOutKindEnum: TypeAlias = Literal[
    "secret", "credential", "member", "backend", "token", "runner", "ssh_key", "session", "workspace", "budget"
]
"""
* `secret` - Secret
* `credential` - Credential
* `member` - Member
* `backend` - Backend
* `token` - Token
* `runner` - Runner
* `ssh_key` - SSH key
* `session` - Session
* `workspace` - Workspace
* `budget` - Budget
"""


class AuthConfigOut(TypedDict):
    github: bool
    local_login: bool


class AwsSetupOut(TypedDict):
    external_id: str
    principal: str
    installation: str
    prefix: str
    trust_policy: Any
    permission_policy: Any


BackendCreateInKindEnum: TypeAlias = Literal["aws", "kubernetes"]
"""
* `aws` - aws
* `kubernetes` - kubernetes
"""


Region: TypeAlias = str


Subnet: TypeAlias = str


ImagePullSecret: TypeAlias = str


BackendEnum: TypeAlias = Literal["local", "fake", "self-hosted", "aws", "kubernetes"]
"""
* `local` - Local
* `fake` - Fake
* `self-hosted` - Self Hosted
* `aws` - Aws
* `kubernetes` - Kubernetes
"""


BackendOutStatusEnum: TypeAlias = Literal["active", "broken"]
"""
* `active` - Active
* `broken` - Broken
"""


BackendsEnum: TypeAlias = Literal["aws", "kubernetes", "local", "fake", "self-hosted"]
"""
* `aws` - aws
* `kubernetes` - kubernetes
* `local` - local
* `fake` - fake
* `self-hosted` - self-hosted
"""


BlankEnum: TypeAlias = Literal[""]


class BlobOut(TypedDict):
    id: str
    size: int
    sha256: str


class BudgetInRequest(TypedDict):
    monthly_limit: NotRequired[str | None]
    """
    USD, e.g. "500" or "499.99"; null: no monthly cap
    """
    gpu_quota: NotRequired[int | None]
    """
    a member's budget only
    """
    warn_percent: NotRequired[int]
    """
    1 to 99 (default 80)
    """


class BudgetOut(TypedDict):
    user: str | None
    """
    the member's username; null: the workspace's own row
    """
    monthly_limit: str | None
    """
    USD a month (UTC); null: no cap
    """
    gpu_quota: int | None
    """
    a member's running GPUs at once; null: none
    """
    warn_percent: int
    """
    the workspace's subscriptions are told at this percent
    """
    spent: str
    """
    USD spent this month (UTC) by what the budget counts
    """
    rate_per_hour: str
    """
    USD per hour: what it spends now (its running machines)
    """
    percent: float | None
    """
    spent / monthly_limit × 100; null: no limit
    """
    gpus_running: int | None
    """
    the GPUs its active jobs hold now (the workspace's row: all of them)
    """


class BudgetsOut(TypedDict):
    currency: str
    """
    always "USD"
    """
    month: str
    """
    the month counted, YYYY-MM (UTC)
    """
    budgets: list[BudgetOut]
    """
    the workspace's row first, then each member with a budget, by name
    """


ByEnum: TypeAlias = Literal["user", "workflow", "backend", "day", "week", "month"]
"""
* `user` - user
* `workflow` - workflow
* `backend` - backend
* `day` - day
* `week` - week
* `month` - month
"""


class CacheHitOut(TypedDict):
    run: str
    job: str


CacheReasonOutKindEnum: TypeAlias = Literal[
    "no_cache",
    "not_cacheable",
    "no_earlier_run",
    "code_changed",
    "spec_changed",
    "env_changed",
    "environment_changed",
    "input_changed",
    "input_pending",
]
"""
* `no_cache` - no_cache
* `not_cacheable` - not_cacheable
* `no_earlier_run` - no_earlier_run
* `code_changed` - code_changed
* `spec_changed` - spec_changed
* `env_changed` - env_changed
* `environment_changed` - environment_changed
* `input_changed` - input_changed
* `input_pending` - input_pending
"""


class CheckpointVersionOut(TypedDict):
    number: int
    attempt: int
    """
    the attempt that synced it
    """
    size: int
    files: int
    completed_at: str


CodeEnum: TypeAlias = Literal["archive", "patch"]
"""
* `archive` - archive
* `patch` - patch
"""


class CostRowOut(TypedDict):
    key: str
    """
    the user, workflow, backend, UTC day (YYYY-MM-DD), week (its Monday, YYYY-MM-DD) or month (YYYY-MM)
    """
    cost: str
    """
    USD, a decimal string
    """


CredentialKind: TypeAlias = Literal["https-token", "ssh-key"]
"""
* `https-token` - Https Token
* `ssh-key` - Ssh Key
"""


class CredentialOut(TypedDict):
    set: bool
    kind: str
    set_at: str


class CurrentJobOut(TypedDict):
    run: str
    job: str
    job_name: str


class DataEndpointInRequest(TypedDict):
    endpoint_url: str
    region: NotRequired[str]
    access_key_id: NotRequired[str]
    secret_access_key: NotRequired[str]


class DataEndpointOut(TypedDict):
    endpoint_url: str
    region: str
    access_key_id: str
    has_secret: bool
    created_at: str
    updated_at: str


class DataFileOut(TypedDict):
    path: str
    """
    relative to the input's path; "" for a one-file input
    """
    size: int
    url: str
    """
    GET URL (presigned for s3://, pinned to the listed version)
    """
    etag: str
    sha256: str
    identity: str
    """
    what the machine's cache keeps the bytes under
    """


class DataPageOut(TypedDict):
    path: str
    files: list[DataFileOut]
    next: str
    """
    the "after" of the next page; "" after the last
    """


class DataUrlInRequest(TypedDict):
    path: str
    """
    the data input's path, as in the assignment
    """
    file: str
    """
    the file's path within it
    """


DeliveryOutStatusEnum: TypeAlias = Literal["pending", "delivered", "failed"]
"""
* `pending` - Pending
* `delivered` - Delivered
* `failed` - Failed
"""


DevEnvironmentOutKindEnum: TypeAlias = Literal["code", "lab", "notebook"]
"""
* `code` - code
* `lab` - lab
* `notebook` - notebook
"""


DeviceDecisionOutStateEnum: TypeAlias = Literal["approved", "denied"]
"""
* `approved` - approved
* `denied` - denied
"""


class DeviceRequestOut(TypedDict):
    user_code: str
    client_name: str
    address: str | None
    """
    The address the request came from.
    """
    created_at: str
    expires_at: str


class DeviceStartInRequest(TypedDict):
    client_name: str
    """
    What is signing in, shown to the person who approves it (the token's name).
    """


class DeviceStartOut(TypedDict):
    device_code: str
    """
    The device's secret: it polls with it. Shown this once.
    """
    user_code: str
    """
    Typed on the dashboard: two groups of four letters, like BCDF-GHJK.
    """
    verification_uri: str
    """
    The dashboard page where the code is entered.
    """
    verification_uri_complete: str
    """
    That page with the code filled in.
    """
    expires_in: int
    """
    Seconds the code may be approved.
    """
    interval: int
    """
    Seconds to wait between polls.
    """


class DeviceTokenInRequest(TypedDict):
    device_code: str


class DeviceTokenOut(TypedDict):
    token: str
    """
    A new API token of the person who approved: shown this once.
    """
    name: str
    """
    The token's name (the device's client_name).
    """
    username: str
    expires_at: str


class DonePartInRequest(TypedDict):
    number: int
    sha256: str
    etag: str


class DownloadUrlInRequest(TypedDict):
    code: NotRequired[CodeEnum]
    input: NotRequired[str]
    checkpoint: NotRequired[int]
    """
    a checkpoint version's number
    """
    cache: NotRequired[str]
    """
    a cache: path of the job's workflow
    """
    file: NotRequired[str]


class DownloadUrlOut(TypedDict):
    url: str


EffectEnum: TypeAlias = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
"""
* `` -
* `NoSchedule` - NoSchedule
* `PreferNoSchedule` - PreferNoSchedule
* `NoExecute` - NoExecute
"""


class EnvironmentArchiveOut(TypedDict):
    url: str
    """
    signed GET URL of the packed environment
    """
    size: int
    sha256: str


class EnvironmentDetailOut(TypedDict):
    key: str
    """
    digest of the spec, its files and the platform (docs/ENVIRONMENTS.md)
    """
    platform: dict[str, str]
    build_seconds: float
    """
    how long its build took
    """
    size_bytes: int
    packages: int
    """
    how many packages are installed
    """
    built_on: str
    """
    the machine that reported it first
    """
    created_at: str
    last_used_at: str
    runs: int
    """
    runs whose jobs ran in it
    """
    stored: bool
    """
    packed into the workspace's storage: a runner on another machine restores it instead of building
    """
    lock: str
    """
    the resolved requirements, with versions and hashes
    """
    installed: str
    """
    `uv pip freeze` after the setup commands
    """
    recent_runs: list[str]
    """
    the latest 20 runs that used it
    """


class EnvironmentKeyInRequest(TypedDict):
    key: str
    """
    the environment's key
    """


class EnvironmentOut(TypedDict):
    key: str
    """
    digest of the spec, its files and the platform (docs/ENVIRONMENTS.md)
    """
    platform: dict[str, str]
    build_seconds: float
    """
    how long its build took
    """
    size_bytes: int
    packages: int
    """
    how many packages are installed
    """
    built_on: str
    """
    the machine that reported it first
    """
    created_at: str
    last_used_at: str
    runs: int
    """
    runs whose jobs ran in it
    """
    stored: bool
    """
    packed into the workspace's storage: a runner on another machine restores it instead of building
    """


class EnvironmentPackedInRequest(TypedDict):
    key: str
    """
    the environment's key
    """
    size: int
    """
    bytes of the packed environment
    """
    sha256: str


class EnvironmentUploadOut(TypedDict):
    url: str | None
    """
    signed PUT URL; null when it is stored already or another runner uploads it
    """
    headers: dict[str, str]
    """
    to send with the PUT
    """


ErrorEnum: TypeAlias = Literal[
    "authorization_pending", "slow_down", "access_denied", "expired_token", "invalid_grant", "invalid_request"
]
"""
* `authorization_pending` - authorization_pending
* `slow_down` - slow_down
* `access_denied` - access_denied
* `expired_token` - expired_token
* `invalid_grant` - invalid_grant
* `invalid_request` - invalid_request
"""


EventsEnum: TypeAlias = Literal[
    "run.succeeded",
    "run.failed",
    "run.stopped",
    "attempt.interrupted",
    "attempt.resumed",
    "job.waiting_capacity",
    "guard.fired",
    "budget.80",
    "budget.100",
]
"""
* `run.succeeded` - run.succeeded
* `run.failed` - run.failed
* `run.stopped` - run.stopped
* `attempt.interrupted` - attempt.interrupted
* `attempt.resumed` - attempt.resumed
* `job.waiting_capacity` - job.waiting_capacity
* `guard.fired` - guard.fired
* `budget.80` - budget.80
* `budget.100` - budget.100
"""


ExportOutStatusEnum: TypeAlias = Literal["pending", "copying", "done", "failed"]
"""
* `pending` - Pending
* `copying` - Copying
* `done` - Done
* `failed` - Failed
"""


class FileInRequest(TypedDict):
    path: str
    size: int
    sha256: str


class GpuOut(TypedDict):
    name: str
    memory_bytes: int


class GrantOut(TypedDict):
    id: str
    token: str
    """
    the client's credential (Authorization: Bearer), shown once
    """
    url: str
    """
    the client's websocket
    """
    expires_at: str
    """
    the first connect must come before
    """
    run: str
    job: str
    attempt: int
    kind: str
    host_alias: str
    host_key: str
    """
    the runner's SSH host key (kind ssh)
    """


class Health(TypedDict):
    status: str
    max_blob_bytes: int
    """
    The largest code blob accepted (bytes).
    """


class InputFileOut(TypedDict):
    path: str
    size: int
    sha256: str
    url: str
    """
    signed GET URL
    """


class InputPageOut(TypedDict):
    path: str
    files: list[InputFileOut]
    next: str
    """
    the "after" of the next page; "" after the last
    """


InstanceStatus: TypeAlias = Literal["provisioning", "idle", "busy", "unreachable", "terminating", "terminated", "lost"]
"""
* `provisioning` - Provisioning
* `idle` - Idle
* `busy` - Busy
* `unreachable` - Unreachable
* `terminating` - Terminating
* `terminated` - Terminated
* `lost` - Lost
"""


class JobDataInputOut(TypedDict):
    uri: str
    path: str
    """
    where it is placed in the job's working directory
    """
    read_only: bool
    file_count: int | None
    """
    null: its listing is not known
    """
    total_size: int | None
    """
    bytes; null: its listing is not known
    """
    versioned: bool
    """
    every object has a version id (a re-run reads these again)
    """


JobOutStatusEnum: TypeAlias = Literal["pending", "assigned", "running", "stopping", "succeeded", "failed", "stopped"]
"""
* `pending` - Pending
* `assigned` - Assigned
* `running` - Running
* `stopping` - Stopping
* `succeeded` - Succeeded
* `failed` - Failed
* `stopped` - Stopped
"""


class JobVolumeOut(TypedDict):
    name: str
    path: str
    read_only: bool


KindEnum: TypeAlias = Literal["git", "archive"]
"""
* `git` - git
* `archive` - archive
"""


class LastValueOut(TypedDict):
    value: float
    step: int | None
    t: str
    """
    ISO 8601, UTC
    """
    attempt: int


LineageEdgeOutKindEnum: TypeAlias = Literal["tag", "run", "workflow", "cache"]
"""
* `tag` - tag
* `run` - run
* `workflow` - workflow
* `cache` - cache
"""


class LineageRunOut(TypedDict):
    name: str
    workflow: str
    status: str
    created_at: str
    submitted_by: str
    tags: list[str]
    distance: int
    """
    steps from the run asked about: negative upstream (it fed that run), positive downstream, 0 itself
    """


class LogSearchOut(TypedDict):
    job: str
    seq: int | None
    """
    the nearest matching line, or null
    """
    last_seq: int
    partial: bool
    """
    no match before the search's byte budget ran out, short of the log's end (prev: start)
    """
    searched_to: int | None
    """
    when partial: the last seq read (for prev: the first); search again from just past it to go on
    """


class LoginInRequest(TypedDict):
    username: str
    password: str


class MetricPointsOut(TypedDict):
    x: list[float]
    """
    step, or Unix seconds
    """
    y: list[float]
    """
    the value (system: the mean)
    """
    min: NotRequired[list[float]]
    """
    system series
    """
    max: NotRequired[list[float]]
    """
    system series
    """
    attempt: list[int]
    t: NotRequired[list[float]]
    """
    training series: each value's Unix time
    """


MetricSeriesOutKindEnum: TypeAlias = Literal["system", "training"]
"""
* `system` - system
* `training` - training
"""


class MetricsAttemptOut(TypedDict):
    number: int
    started_at: str | None
    finished_at: str | None
    termination_reason: str


class NamesOut(TypedDict):
    names: list[str]
    """
    at most 50, runs newest first
    """


NotificationKindEnum: TypeAlias = Literal["webhook", "slack", "email"]
"""
* `webhook` - Webhook
* `slack` - Slack
* `email` - Email
"""


class OfferOut(TypedDict):
    offer_id: str
    backend: str
    account: str
    region: str
    zone: str
    instance_type: str
    spot: bool
    price_per_hour: float
    cpus: int
    memory_bytes: int
    disk_bytes: int
    gpus: list[GpuOut]
    catalog_date: str | None


class OffersOut(TypedDict):
    offers: list[OfferOut]
    shortfall: str
    accounts: int


OperatorEnum: TypeAlias = Literal["Exists", "Equal"]
"""
* `Exists` - Exists
* `Equal` - Equal
"""


OutcomeEnum: TypeAlias = Literal["uploaded", "removed"]
"""
* `uploaded` - uploaded
* `removed` - removed
"""


class PartInRequest(TypedDict):
    number: int
    sha256: str


class PartsDoneInRequest(TypedDict):
    path: str
    parts: list[DonePartInRequest]


class PatchedRunnerChangeInRequest(TypedDict):
    price_per_hour: NotRequired[str]


class PatchedSubscriptionChangeInRequest(TypedDict):
    events: NotRequired[list[EventsEnum]]
    enabled: NotRequired[bool]


class PlanCodeInRequest(TypedDict):
    kind: KindEnum
    repo_url: NotRequired[str]
    commit: NotRequired[str]
    patch_blob: NotRequired[str | None]
    archive_blob: NotRequired[str | None]
    patch_files: NotRequired[dict[str, str] | None]
    patch_sha256: NotRequired[str]
    archive_sha256: NotRequired[str]


class PlannedDataOut(TypedDict):
    uri: str
    path: str
    file_count: int
    total_size: int
    size: str
    """
    total_size in words (1.2 GiB)
    """
    versioned: bool
    """
    every object has a version id (a re-run reads these again)
    """
    snapshot: str
    """
    the listing's digest (part of the job's cache key)
    """
    cached_on: list[str]
    """
    idle machines of the workspace whose cache holds it
    """


PlannedEnvironmentOutStateEnum: TypeAlias = Literal["ready", "to build", "unknown"]
"""
* `ready` - ready
* `to build` - to build
* `unknown` - unknown
"""


class RegisterInRequest(TypedDict):
    token: str
    name: NotRequired[str]
    hostname: NotRequired[str]


class RegisterOut(TypedDict):
    runner: str
    name: str
    workspace: str
    runner_token: str


class RegistrationTokenCreatedOut(TypedDict):
    id: str
    prefix: str
    note: str
    state: str
    created_at: str
    expires_at: str
    used_at: str | None
    price_per_hour: Decimal
    runner: str | None
    token: str


class RegistrationTokenInRequest(TypedDict):
    note: NotRequired[str]
    price_per_hour: NotRequired[str | None]


class RegistrationTokenOut(TypedDict):
    id: str
    prefix: str
    note: str
    state: str
    created_at: str
    expires_at: str
    used_at: str | None
    price_per_hour: Decimal
    runner: str | None


class RepoOut(TypedDict):
    id: str
    name: str
    url: str
    runs: int
    last_run_at: str | None
    credential: CredentialOut | None


ReproducedOutStateEnum: TypeAlias = Literal["reproduced", "differs", "not_comparable", "pending"]
"""
* `reproduced` - reproduced
* `differs` - differs
* `not_comparable` - not_comparable
* `pending` - pending
"""


class ResourcesInRequest(TypedDict):
    gpu: NotRequired[str]
    """
    e.g. "A10G:2", "2" or "none"
    """
    cpu: NotRequired[int]
    memory: NotRequired[str]
    """
    e.g. "16GB"
    """
    disk: NotRequired[str]
    """
    e.g. "100GB"
    """


Role: TypeAlias = Literal["admin", "member", "viewer"]
"""
* `admin` - Admin
* `member` - Member
* `viewer` - Viewer
"""


RunOutStatusEnum: TypeAlias = Literal["pending", "running", "stopping", "succeeded", "failed", "stopped"]
"""
* `pending` - Pending
* `running` - Running
* `stopping` - Stopping
* `succeeded` - Succeeded
* `failed` - Failed
* `stopped` - Stopped
"""


RunnerCredentialOutKindEnum: TypeAlias = Literal["https-token", "ssh-key"]
"""
* `https-token` - https-token
* `ssh-key` - ssh-key
"""


ScopeEnum: TypeAlias = Literal["workspace", "mine"]
"""
* `workspace` - Workspace
* `mine` - Mine
"""


class SecretInRequest(TypedDict):
    value: str


class SecretOut(TypedDict):
    name: str
    created_at: str
    updated_at: str
    readable: NotRequired[bool]
    """
    false: no key of the server opens the value; jobs of the workspace fail until fixed
    """
    problem: NotRequired[str]
    """
    when not readable: what is wrong and what to do
    """


class SelfHostedRunnerOut(TypedDict):
    id: str
    name: str
    status: InstanceStatus
    status_reason: str
    revoked: bool
    hostname: str
    address: str
    runner_version: str
    cpus: int
    memory_bytes: int
    disk_bytes: int
    gpus: Any
    price_per_hour: Decimal
    price_source: str
    created_at: str
    connected_at: str | None
    last_heartbeat_at: str | None


SessionInKindEnum: TypeAlias = Literal["ssh", "terminal", "port"]
"""
* `ssh` - Ssh
* `terminal` - Terminal
* `port` - Port
"""


class SessionInRequest(TypedDict):
    job: NotRequired[str]
    """
    the job's name
    """
    kind: SessionInKindEnum
    port: NotRequired[int | None]
    client: NotRequired[str]
    """
    e.g. "cli ssh"
    """


class SessionOut(TypedDict):
    id: str
    user: str
    run: str
    job: str
    attempt: int
    kind: str
    port: int | None
    state: str
    client_address: str | None
    client_label: str
    created_at: str
    started_at: str | None
    ended_at: str | None
    end_reason: str
    bytes_up: int
    bytes_down: int
    last_activity_at: str | None


class SourceWorkflowOut(TypedDict):
    name: str
    provider: str
    help: str


SpotPolicyEnum: TypeAlias = Literal["spot", "on-demand", "auto"]
"""
* `spot` - spot
* `on-demand` - on-demand
* `auto` - auto
"""


class SshKeyInRequest(TypedDict):
    public_key: str
    name: NotRequired[str]


class SshKeyOut(TypedDict):
    id: str
    name: str
    public_key: str
    """
    One OpenSSH line: <type> <base64>.
    """
    fingerprint: str
    """
    SHA256:…, as `ssh-keygen -l` prints it.
    """
    created_at: str
    last_used_at: str | None


StallActionEnum: TypeAlias = Literal["stop", "restart"]
"""
* `stop` - stop
* `restart` - restart
"""


class StallPolicyDefault(TypedDict):
    timeout: str
    """
    no new log line and no new metric value for this long; a duration as in a workflow: 30m, 2h, 1h30m, 1d
    """
    action: NotRequired[StallActionEnum]
    """
    stop the job, or end the attempt and start the next from its last checkpoint

    * `stop` - stop
    * `restart` - restart
    """


class StallPolicyDefaultRequest(TypedDict):
    timeout: str
    """
    no new log line and no new metric value for this long; a duration as in a workflow: 30m, 2h, 1h30m, 1d
    """
    action: NotRequired[StallActionEnum]
    """
    stop the job, or end the attempt and start the next from its last checkpoint

    * `stop` - stop
    * `restart` - restart
    """


StreamEnum: TypeAlias = Literal["o", "e"]
"""
* `o` - o
* `e` - e
"""


class SubscriptionCreatedOut(TypedDict):
    id: str
    kind: NotificationKindEnum
    scope: ScopeEnum
    target: str
    events: Any
    enabled: bool
    failing_since: str | None
    disabled_reason: str
    created_by: str
    created_at: str
    secret: str


class SubscriptionInRequest(TypedDict):
    kind: NotificationKindEnum
    target: str
    events: list[EventsEnum]
    scope: NotRequired[ScopeEnum]


class SubscriptionOut(TypedDict):
    id: str
    kind: NotificationKindEnum
    scope: ScopeEnum
    target: str
    events: Any
    enabled: bool
    failing_since: str | None
    disabled_reason: str
    created_by: str
    created_at: str


class TagInRequest(TypedDict):
    name: str
    run: str
    """
    run name or id
    """
    force: NotRequired[bool]


class TagOut(TypedDict):
    name: str
    run: str
    run_id: str
    created_by: NotRequired[str | None]
    created_at: str
    updated_at: str


class TargetOut(TypedDict):
    number: int
    """
    part number; 0 for a whole file
    """
    url: str
    headers: dict[str, str]
    seconds: int
    """
    how long the URL lives
    """


class TokenCreatedOut(TypedDict):
    id: str
    name: str
    prefix: str
    created_at: str
    last_used_at: str | None
    expires_at: str | None
    """
    null: never expires.
    """
    token: str
    """
    The token itself: shown this once.
    """


class TokenInRequest(TypedDict):
    name: str
    expires_in: NotRequired[str]
    """
    Lifetime: 30d, 12h, 90m, 2w (at most 3650d), or never. Absent or empty: TRAINYARD_API_TOKEN_DAYS (90).
    """


class TokenOut(TypedDict):
    id: str
    name: str
    prefix: str
    created_at: str
    last_used_at: str | None
    expires_at: str | None
    """
    null: never expires.
    """


class Toleration(TypedDict):
    key: NotRequired[str]
    operator: NotRequired[OperatorEnum]
    value: NotRequired[str]
    effect: NotRequired[EffectEnum | BlankEnum]
    tolerationSeconds: NotRequired[int]


class TolerationRequest(TypedDict):
    key: NotRequired[str]
    operator: NotRequired[OperatorEnum]
    value: NotRequired[str]
    effect: NotRequired[EffectEnum | BlankEnum]
    tolerationSeconds: NotRequired[int]


class UploadOut(TypedDict):
    path: str
    url: str
    """
    PUT the file here; empty when it goes up in parts
    """
    headers: dict[str, str]
    """
    send these with the PUT
    """
    part_size: int
    """
    > 0: upload in parts of this size (the last may be smaller)
    """
    parts: int


class UploadUrlsInRequest(TypedDict):
    path: str
    parts: NotRequired[list[PartInRequest]]


class UploadUrlsOut(TypedDict):
    path: str
    targets: list[TargetOut]


class UtilizationPolicyDefault(TypedDict):
    min_gpu_utilization: int
    """
    percent: every GPU below it for the whole window stops the job
    """
    time_window: str
    """
    a duration as in a workflow: 30m, 2h, 1h30m, 1d
    """


class UtilizationPolicyDefaultRequest(TypedDict):
    min_gpu_utilization: int
    """
    percent: every GPU below it for the whole window stops the job
    """
    time_window: str
    """
    a duration as in a workflow: 30m, 2h, 1h30m, 1d
    """


class VolumeAttachedOut(TypedDict):
    run: str
    job: str
    job_name: str
    job_status: str


VolumeCreateInBackendEnum: TypeAlias = Literal["aws", "local", "self-hosted"]
"""
* `aws` - aws
* `local` - local
* `self-hosted` - self-hosted
"""


class VolumeCreateInRequest(TypedDict):
    name: str
    size: str
    backend: VolumeCreateInBackendEnum
    region: NotRequired[str]
    zone: NotRequired[str]
    machine: NotRequired[str]


class VolumeHolderOut(TypedDict):
    job: str
    run: str


VolumeOutStatusEnum: TypeAlias = Literal["creating", "available", "attached", "deleting", "deleted", "failed"]
"""
* `creating` - Creating
* `available` - Available
* `attached` - Attached
* `deleting` - Deleting
* `deleted` - Deleted
* `failed` - Failed
"""


class WorkflowsFileIn(TypedDict):
    path: str
    text: str


class WorkflowsFileInRequest(TypedDict):
    path: str
    text: str


class WorkspaceInRequest(TypedDict):
    name: str
    slug: NotRequired[str]


class WorkspaceOut(TypedDict):
    slug: str
    name: str
    role: Role
    personal: bool


class WorkspaceRefOut(TypedDict):
    slug: str
    name: str
    role: Role


XEnum: TypeAlias = Literal["step", "time"]
"""
* `step` - step
* `time` - time
"""


class ArtifactBeginInRequest(TypedDict):
    path: str
    files: list[FileInRequest]


class ArtifactBeginOut(TypedDict):
    id: str
    uploads: list[UploadOut]


class AttemptOut(TypedDict):
    number: int
    status: AttemptOutStatusEnum
    instance: NotRequired[str | None]
    backend: NotRequired[str | None]
    """
    the machine's backend
    """
    instance_type: NotRequired[str | None]
    region: NotRequired[str | None]
    zone: NotRequired[str | None]
    spot: NotRequired[bool | None]
    """
    spot (true) or on-demand
    """
    reason: str
    message: str
    exit_code: int | None
    started_at: str | None
    finished_at: str | None
    first_seq: int
    last_seq: int | None
    offers_tried: Any
    restored_checkpoint: int | None
    environment: str
    """
    the key of the environment its commands ran in (docs/ENVIRONMENTS.md); empty for none
    """
    cost: str | None
    """
    USD, a decimal string ("0.7010"): price_per_hour x billed_seconds; null: it held no machine
    """
    price_per_hour: str | None
    """
    USD, its machine's price; null: no machine
    """
    billed_seconds: int | None
    """
    the whole seconds it held its machine (until now while it runs); null: no machine
    """
    created_at: str


class AuditEventOut(TypedDict):
    id: str
    at: str
    kind: AuditEventOutKindEnum
    action: str
    """
    <kind>.<verb>: secret.created, member.removed, runner.registered …
    """
    target: str
    """
    what it was done to: a secret's name, a login, a backend …
    """
    actor: str
    """
    user or runner
    """
    username: str
    """
    the user who acted ('' when a runner did)
    """
    runner: str
    """
    the runner that acted with its own token ('' when a user did)
    """
    address: str | None
    """
    the client's IP address
    """
    detail: dict[str, Any]


class AuditPageOut(TypedDict):
    next: str | None
    """
    the next page's URL; null on the last
    """
    results: list[AuditEventOut]


class CacheReasonOut(TypedDict):
    kind: CacheReasonOutKindEnum
    text: str


class CheckpointBeginOut(TypedDict):
    id: str
    uploads: list[UploadOut]
    number: int
    """
    the version's number n (…/checkpoints/<attempt>/<n>/)
    """
    carried: int
    """
    files unchanged since the latest version: not uploaded again
    """


class CheckpointOut(TypedDict):
    path: str
    latest: CheckpointVersionOut | None
    """
    the version an interrupted job resumes from
    """


class CodeIn(TypedDict):
    kind: KindEnum
    repo_url: NotRequired[str]
    commit: NotRequired[str]
    patch_blob: NotRequired[str | None]
    archive_blob: NotRequired[str | None]
    patch_files: NotRequired[dict[str, str] | None]


class CodeInRequest(TypedDict):
    kind: KindEnum
    repo_url: NotRequired[str]
    commit: NotRequired[str]
    patch_blob: NotRequired[str | None]
    archive_blob: NotRequired[str | None]
    patch_files: NotRequired[dict[str, str] | None]


class ComparedSeriesOut(TypedDict):
    name: str
    job: str
    x: XEnum
    points: MetricPointsOut


class CostReportOut(TypedDict):
    currency: str
    """
    always "USD"
    """
    since: str
    until: str
    by: ByEnum
    total: str
    """
    USD: the rows' sum and the idle line
    """
    idle: str
    """
    USD: what the machines that started in the window cost while no job held them
    """
    rows: list[CostRowOut]
    """
    the costliest first (by day, week or month: in date order)
    """


class CredentialInRequest(TypedDict):
    url: str
    kind: CredentialKind
    secret: str
    username: NotRequired[str]


class DeliveryOut(TypedDict):
    id: str
    event_id: str
    event_type: str
    status: DeliveryOutStatusEnum
    attempts: int
    last_status_code: int | None
    last_error: str
    next_at: str | None
    delivered_at: str | None
    created_at: str


class DevEnvironmentOut(TypedDict):
    kind: DevEnvironmentOutKindEnum
    inactivity_seconds: int | None
    """
    stopped after this long with no session into it; null: never
    """
    app_port: int | None
    """
    the port Jupyter serves on (lab, notebook), once the job runs; else null
    """


class DeviceDecisionOut(TypedDict):
    user_code: str
    client_name: str
    state: DeviceDecisionOutStateEnum


class DeviceGrantErrorOut(TypedDict):
    error: ErrorEnum
    """
    RFC 8628's answer: wait, wait longer (interval), or stop; invalid_request: no usable device_code.

    * `authorization_pending` - authorization_pending
    * `slow_down` - slow_down
    * `access_denied` - access_denied
    * `expired_token` - expired_token
    * `invalid_grant` - invalid_grant
    * `invalid_request` - invalid_request
    """
    message: str
    interval: NotRequired[int]
    """
    Seconds to wait before the next poll.
    """


class ExportOut(TypedDict):
    id: str
    job: str
    job_name: str
    path: str
    artifact: str | None
    destination: str
    status: ExportOutStatusEnum
    attempts: int
    error: str
    next_attempt_at: str | None
    done_at: str | None
    objects_copied: int
    bytes_copied: int
    method: str


class GuardDefaultsInRequest(TypedDict):
    utilization_policy: NotRequired[UtilizationPolicyDefaultRequest | None]
    """
    left out or null: no default
    """
    stall: NotRequired[StallPolicyDefaultRequest | None]
    """
    left out or null: no default
    """


class GuardDefaultsOut(TypedDict):
    utilization_policy: UtilizationPolicyDefault | None
    """
    null: no default
    """
    stall: StallPolicyDefault | None
    """
    null: no default
    """


class InstanceOut(TypedDict):
    id: str
    name: str
    backend: BackendEnum
    account: str | None
    """
    The name of the backend (cloud account) it runs in.
    """
    backend_id: str
    instance_type: str
    region: str
    zone: str
    spot: bool
    price_per_hour: float
    """
    USD an hour: compute and the root volume's storage
    """
    storage_price_per_hour: float
    """
    USD an hour: the root volume's storage (part of price_per_hour; 0 where none is billed)
    """
    price_source: str
    market: str
    running_at: str | None
    terminated_at: str | None
    billed_seconds: int
    """
    from its first hello to its termination (else now), whole seconds, at least 60 (docs/COST.md)
    """
    cost: str
    """
    USD, a decimal string: price x billed seconds (its attempts' shares and its idle time)
    """
    status: InstanceStatus
    status_reason: str
    hostname: str
    address: str
    cpus: int
    memory_bytes: int
    gpus: Any
    current_job: CurrentJobOut | None
    created_at: str
    last_heartbeat_at: str | None
    uptime_seconds: float
    cloud_state: str
    cloud_checked_at: str | None


class InvitationOut(TypedDict):
    id: str
    github_login: str
    github_id: int | None
    """
    null: matched by the login
    """
    email: str
    role: Role
    created_at: str
    expires_at: str


class JobMetricsOut(TypedDict):
    job: str
    attempts: list[MetricsAttemptOut]
    system: list[str]
    """
    cpu, memory, …, gpu0.util, …
    """
    training: list[str]
    last: dict[str, LastValueOut]
    """
    each series' latest value
    """
    dropped: int
    """
    training values over the per-minute cap
    """
    malformed: int
    """
    lines of the metrics file skipped
    """
    frames_dropped: int
    """
    frames the server dropped (faster than its cap)
    """


class KeptInRequest(TypedDict):
    outcome: OutcomeEnum


class LineageEdgeOut(TypedDict):
    producer: str
    """
    the run whose artifacts were read
    """
    consumer: str
    """
    the run that read them
    """
    kind: LineageEdgeOutKindEnum
    """
    how: `deps: - tag:`, `- run:`, another repository's `- workflow:`, or a job reused from the cache

    * `tag` - tag
    * `run` - run
    * `workflow` - workflow
    * `cache` - cache
    """
    name: str
    """
    the tag, run or workflow the deps named (the job's name for cache)
    """
    job: str
    """
    the consumer's job
    """


class LineageOut(TypedDict):
    run: str
    depth: int
    truncated: bool
    """
    more runs lie past the depth or the size bound
    """
    runs: list[LineageRunOut]
    edges: list[LineageEdgeOut]


class LogLineOut(TypedDict):
    seq: int
    ts: float
    """
    unix time in seconds
    """
    stream: StreamEnum
    """
    o: stdout, e: stderr

    * `o` - o
    * `e` - e
    """
    text: str


class LogPageOut(TypedDict):
    job: str
    lines: list[LogLineOut]
    has_more: bool
    """
    lines are left in the direction read (before the first for before_seq and tail)
    """
    last_seq: int
    """
    the job's watermark: its highest seq received
    """


class MeOut(TypedDict):
    username: str
    avatar_url: str
    default_workspace: str | None
    workspaces: list[WorkspaceRefOut]


class MemberInRequest(TypedDict):
    github_login: NotRequired[str]
    email: NotRequired[str]
    github_id: NotRequired[int | None]
    """
    GitHub's numeric id of github_login: only that account matches (GitHub recycles logins).
    """
    role: NotRequired[Role]


class MemberInvited(TypedDict):
    invitation: InvitationOut


class MemberOut(TypedDict):
    username: str
    role: Role
    avatar_url: str
    joined_at: str


class MetricSeriesOut(TypedDict):
    name: str
    kind: MetricSeriesOutKindEnum
    x: XEnum
    unit: str
    resolution: NotRequired[str]
    """
    system series: "raw", "1m" or "<n>s"
    """
    points: MetricPointsOut


class NodePool(TypedDict):
    name: str
    instance_type: str
    cpus: int
    memory_gib: float
    gpus: NotRequired[int]
    gpu_name: NotRequired[str]
    gpu_memory_gib: NotRequired[float]
    spot: NotRequired[bool]
    price: NotRequired[float | None]
    node_selector: NotRequired[dict[str, str]]
    tolerations: NotRequired[list[Toleration]]


class NodePoolRequest(TypedDict):
    name: str
    instance_type: str
    cpus: int
    memory_gib: float
    gpus: NotRequired[int]
    gpu_name: NotRequired[str]
    gpu_memory_gib: NotRequired[float]
    spot: NotRequired[bool]
    price: NotRequired[float | None]
    node_selector: NotRequired[dict[str, str]]
    tolerations: NotRequired[list[TolerationRequest]]


class PatchedRoleInRequest(TypedDict):
    role: NotRequired[Role]


class PlacementInRequest(TypedDict):
    backends: NotRequired[list[BackendsEnum]]
    regions: NotRequired[list[str]]
    spot_policy: NotRequired[SpotPolicyEnum]
    max_price: NotRequired[float]


class PlannedEnvironmentOut(TypedDict):
    state: PlannedEnvironmentOutStateEnum
    """
    "ready": a runner of the workspace built it; "to build"; "unknown": no digests of its files sent

    * `ready` - ready
    * `to build` - to build
    * `unknown` - unknown
    """
    key: str
    """
    ready: the key it was built under
    """
    built_on: str
    """
    ready: the instance that built it
    """
    stored: bool
    """
    ready: packed in storage, so other machines restore it
    """
    build_seconds: float | None
    """
    ready: its build's; to build: the last build of the workflow's environment
    """


class PlannedVolumeOut(TypedDict):
    name: str
    path: str
    read_only: bool
    where: str
    """
    aws <region> <zone>, machine <name> (self-hosted) or local
    """
    size_bytes: int
    held_by: VolumeHolderOut | None
    """
    the job (and its run) holding it now; null: free
    """


class ReproducedOut(TypedDict):
    state: ReproducedOutStateEnum
    detail: str
    """
    "every artifact byte-identical (3 files)", what differs, or why nothing could be compared
    """
    differences: list[ArtifactDifferenceOut]


class RunCreateInRequest(TypedDict):
    workflow: str
    workflows_file: NotRequired[WorkflowsFileInRequest]
    workflows_files: NotRequired[list[WorkflowsFileInRequest]]
    code: CodeInRequest
    env: NotRequired[dict[str, str]]
    inherited_env: NotRequired[dict[str, str]]
    run_args: NotRequired[list[str]]
    variables: NotRequired[dict[str, dict[str, str]]]
    no_cache: NotRequired[bool]
    placement: NotRequired[PlacementInRequest]
    resources: NotRequired[ResourcesInRequest]
    environment_build: NotRequired[bool]
    """
    only build (and store) the workflow's environment; no commands run
    """
    max_cost: NotRequired[str | None]
    """
    USD, e.g. "20": the run's own cap (wins over the workflow's max_cost)
    """
    queue: NotRequired[bool]
    """
    over a budget: make the run and let its jobs wait for budget
    """
    budget_override: NotRequired[bool]
    """
    admins: let the run past the workspace's and the submitter's budgets (audited)
    """
    environment_files: NotRequired[dict[str, dict[str, str]]]
    """
    by requirements file, the sha256 of it and of the files it includes (-r/-c)
    """


class RunMetricsOut(TypedDict):
    jobs: list[JobMetricsOut]


class RunPlanInRequest(TypedDict):
    workflow: str
    workflows_file: NotRequired[WorkflowsFileInRequest]
    workflows_files: NotRequired[list[WorkflowsFileInRequest]]
    code: PlanCodeInRequest
    env: NotRequired[dict[str, str]]
    inherited_env: NotRequired[dict[str, str]]
    run_args: NotRequired[list[str]]
    variables: NotRequired[dict[str, dict[str, str]]]
    no_cache: NotRequired[bool]
    placement: NotRequired[PlacementInRequest]
    resources: NotRequired[ResourcesInRequest]
    environment_build: NotRequired[bool]
    """
    only build (and store) the workflow's environment; no commands run
    """
    max_cost: NotRequired[str | None]
    """
    USD, e.g. "20": the run's own cap (wins over the workflow's max_cost)
    """
    queue: NotRequired[bool]
    """
    over a budget: make the run and let its jobs wait for budget
    """
    budget_override: NotRequired[bool]
    """
    admins: let the run past the workspace's and the submitter's budgets (audited)
    """
    environment_files: NotRequired[dict[str, dict[str, str]]]
    """
    by requirements file, the sha256 of it and of the files it includes (-r/-c)
    """


class RunSourceOut(TypedDict):
    repo: str
    """
    the repository's URL, or `uploaded code (no git)`
    """
    run: str
    """
    the last run submitted from it: its code and files are used again
    """
    submitted_at: str
    submitted_by: str
    code: CodeIn
    workflows_files: list[WorkflowsFileIn]
    environment_files: dict[str, dict[str, str]]
    workflows: list[SourceWorkflowOut]
    """
    the workflows the files define (none when they no longer parse)
    """


class RunnerCredentialOut(TypedDict):
    kind: RunnerCredentialOutKindEnum
    username: str
    secret: str


class VolumeOut(TypedDict):
    id: str
    name: str
    backend: BackendEnum
    account: str | None
    region: NotRequired[str]
    zone: NotRequired[str]
    size_bytes: NotRequired[int]
    backend_id: NotRequired[str]
    status: NotRequired[VolumeOutStatusEnum]
    status_reason: NotRequired[str]
    machine: str | None
    """
    The self-hosted machine the volume is a folder of.
    """
    attached_machine: str | None
    """
    The machine it is attached to now.
    """
    attached_to: VolumeAttachedOut | None
    device: NotRequired[str]
    created_at: str


class ArtifactOut(TypedDict):
    id: str
    job: str
    path: str
    status: ArtifactOutStatusEnum
    total_size: int
    files: list[ArtifactFileOut]
    created_at: str
    export: ExportOut | None


class BackendCreateInRequest(TypedDict):
    kind: BackendCreateInKindEnum
    name: NotRequired[str]
    """
    default: the kind
    """
    role_arn: NotRequired[str]
    access_key_id: NotRequired[str]
    secret_access_key: NotRequired[str]
    regions: NotRequired[list[Region]]
    bucket: NotRequired[str]
    subnets: NotRequired[dict[str, list[Subnet]]]
    amis: NotRequired[dict[str, str]]
    gpu_amis: NotRequired[dict[str, str]]
    kubeconfig: NotRequired[str]
    """
    kubernetes: the kubeconfig's YAML (credentials inline); encrypted at rest, never returned
    """
    in_cluster: NotRequired[bool]
    """
    kubernetes: the server's own service account, where allowed
    """
    namespace: NotRequired[str]
    context: NotRequired[str]
    cluster: NotRequired[str]
    image: NotRequired[str]
    image_pull_secrets: NotRequired[list[ImagePullSecret]]
    node_selector: NotRequired[dict[str, str]]
    tolerations: NotRequired[list[TolerationRequest]]
    prices: NotRequired[dict[str, float]]
    spot_prices: NotRequired[dict[str, float]]
    default_price: NotRequired[float]
    node_pools: NotRequired[list[NodePoolRequest]]
    schedule_timeout_seconds: NotRequired[float]
    termination_grace_seconds: NotRequired[int]
    gpu_resource: NotRequired[str]


class CacheDecisionOut(TypedDict):
    reused: bool
    text: str
    """
    "reused from <run> (cached)" or "runs: <reason>; <reason>"
    """
    run: NotRequired[str]
    """
    reused: the run whose job did the work
    """
    compared_with: NotRequired[str]
    """
    runs: the earlier run it was compared with ("": none)
    """
    reasons: list[CacheReasonOut]


class ComparedRunOut(TypedDict):
    run: str
    workflow: str
    status: str
    commit: str
    params: dict[str, str]
    """
    "-e NAME": a digest of its value (values are secrets); "var NAME"
    """
    cost: str | None
    """
    USD, where the machines' prices are known
    """
    last: dict[str, float]
    series: list[ComparedSeriesOut]


class JobDetailOut(TypedDict):
    id: str
    name: str
    workflow: str
    provider: NotRequired[str]
    status: JobOutStatusEnum
    status_reason: str
    exit_code: int | None
    attempt: int
    attempts: list[AttemptOut]
    cost: str | None
    """
    USD, a decimal string: the sum of its attempts' costs; null: none held a machine
    """
    instance: NotRequired[str | None]
    ports: Any
    resources: dict[str, Any]
    needs: list[str]
    after_running: list[str]
    cached_from: dict[str, str] | None
    cache_decision: CacheDecisionOut | None
    inputs: list[dict[str, str]]
    checkpoint: CheckpointOut | None
    placement: Any
    on_demand_since: str | None
    placement_note: str
    created_at: str
    started_at: str | None
    finished_at: str | None
    last_seq: int
    log_bytes: int
    log_note: str
    dev_environment: DevEnvironmentOut | None
    data_inputs: list[JobDataInputOut]
    volumes: list[JobVolumeOut]


class JobOut(TypedDict):
    id: str
    name: str
    workflow: str
    provider: NotRequired[str]
    status: JobOutStatusEnum
    status_reason: str
    exit_code: int | None
    attempt: int
    attempts: list[AttemptOut]
    cost: str | None
    """
    USD, a decimal string: the sum of its attempts' costs; null: none held a machine
    """
    instance: NotRequired[str | None]
    ports: Any
    resources: dict[str, Any]
    needs: list[str]
    after_running: list[str]
    cached_from: dict[str, str] | None
    cache_decision: CacheDecisionOut | None
    inputs: list[dict[str, str]]
    checkpoint: CheckpointOut | None
    placement: Any
    on_demand_since: str | None
    placement_note: str
    created_at: str
    started_at: str | None
    finished_at: str | None
    last_seq: int
    log_bytes: int
    log_note: str
    dev_environment: DevEnvironmentOut | None


class JobSecretsOut(TypedDict):
    env: dict[str, str]
    """
    the workspace's secrets by name
    """
    credential: RunnerCredentialOut | None
    """
    the repository's clone credential, if one is set
    """


class JobSeriesOut(TypedDict):
    job: str
    attempts: list[MetricsAttemptOut]
    series: list[MetricSeriesOut]


class KubernetesOut(TypedDict):
    namespace: str
    context: str
    """
    the kubeconfig's context used ("": its current-context)
    """
    cluster: str
    """
    the offers' region ("": the context's cluster name)
    """
    in_cluster: bool
    """
    the server's own service account, not a kubeconfig
    """
    image: str
    """
    "": the backend's default (python:3.12-slim)
    """
    image_pull_secrets: list[str]
    node_selector: dict[str, str]
    tolerations: list[Toleration]
    prices: dict[str, float]
    spot_prices: dict[str, float] | None
    default_price: float | None
    node_pools: list[NodePool]
    schedule_timeout_seconds: float | None
    termination_grace_seconds: int | None
    gpu_resource: str
    nodes: int
    """
    nodes the last facts refresh listed
    """
    facts_refreshed_at: str | None


LogPageOrSearch: TypeAlias = LogPageOut | LogSearchOut


class MemberAdded(TypedDict):
    member: MemberOut


class PlannedJobOut(TypedDict):
    name: str
    workflow: str
    provider: str
    needs: list[str]
    after_running: list[str]
    resources: dict[str, Any]
    inputs: list[dict[str, Any]]
    data_inputs: list[PlannedDataOut]
    """
    its inputs: (docs/DATA.md), as listed now
    """
    volumes: list[PlannedVolumeOut]
    """
    its volumes (docs/DATA.md), where each is and who holds it now
    """
    cache: CacheHitOut | None
    cache_decision: CacheDecisionOut
    commands: list[str]
    environment: PlannedEnvironmentOut | None
    placement: dict[str, Any]
    guards: NotRequired[list[str]]
    """
    its guards (utilization_policy, stall; the workflow's or the workspace's default) in words
    """
    offer: dict[str, Any]
    max_cost: str | None
    """
    USD: the most it may cost, its offer's price × its max_duration; null: no max_duration or no offer
    """


class RerunOut(TypedDict):
    id: str
    name: str
    workflow: str
    help: str
    status: RunOutStatusEnum
    status_reason: str
    exit_code: int | None
    submitted_by: NotRequired[str | None]
    created_at: str
    started_at: str | None
    finished_at: str | None
    duration_seconds: float | None
    cost: str | None
    """
    USD, a decimal string: the sum over every attempt of every job (live while one runs); null: none held a machine
    """
    max_cost: str | None
    """
    USD, a decimal string: the run's own cap (max_cost in the workflow or --max-cost); null: only the budgets cap it
    """
    budget_override: bool
    """
    an admin let it run past the workspace's and its submitter's budgets
    """
    no_cache: bool
    environment_build: bool
    tags: list[str]
    code: dict[str, Any]
    rerun_of: str | None
    """
    a re-run: the original run's name
    """
    reproduced: ReproducedOut | None
    """
    a re-run: whether its artifacts match the original's
    """
    jobs: list[JobDetailOut]
    notices: list[str]
    """
    e.g. an input whose bucket keeps no versions: read as it is now, not as the first run read it
    """
    resumed: list[str]
    """
    the jobs resumed in place from their checkpoints (a run the budget stopped); [] for a new run
    """


class RunDetailOut(TypedDict):
    id: str
    name: str
    workflow: str
    help: str
    status: RunOutStatusEnum
    status_reason: str
    exit_code: int | None
    submitted_by: NotRequired[str | None]
    created_at: str
    started_at: str | None
    finished_at: str | None
    duration_seconds: float | None
    cost: str | None
    """
    USD, a decimal string: the sum over every attempt of every job (live while one runs); null: none held a machine
    """
    max_cost: str | None
    """
    USD, a decimal string: the run's own cap (max_cost in the workflow or --max-cost); null: only the budgets cap it
    """
    budget_override: bool
    """
    an admin let it run past the workspace's and its submitter's budgets
    """
    no_cache: bool
    environment_build: bool
    tags: list[str]
    code: dict[str, Any]
    rerun_of: str | None
    """
    a re-run: the original run's name
    """
    reproduced: ReproducedOut | None
    """
    a re-run: whether its artifacts match the original's
    """
    jobs: list[JobDetailOut]


class RunOut(TypedDict):
    id: str
    name: str
    workflow: str
    help: str
    status: RunOutStatusEnum
    status_reason: str
    exit_code: int | None
    submitted_by: NotRequired[str | None]
    created_at: str
    started_at: str | None
    finished_at: str | None
    duration_seconds: float | None
    cost: str | None
    """
    USD, a decimal string: the sum over every attempt of every job (live while one runs); null: none held a machine
    """
    max_cost: str | None
    """
    USD, a decimal string: the run's own cap (max_cost in the workflow or --max-cost); null: only the budgets cap it
    """
    budget_override: bool
    """
    an admin let it run past the workspace's and its submitter's budgets
    """
    no_cache: bool
    environment_build: bool
    tags: list[str]
    code: dict[str, Any]
    rerun_of: str | None
    """
    a re-run: the original run's name
    """
    reproduced: ReproducedOut | None
    """
    a re-run: whether its artifacts match the original's
    """
    jobs: list[JobOut]


class RunPageOut(TypedDict):
    count: int
    """
    matching runs: exact, or an estimate when count_estimated
    """
    count_estimated: bool
    """
    count is the planner's estimate (above a threshold)
    """
    next: str | None
    """
    the next page (a cursor link); null on the last
    """
    previous: str | None
    """
    always null: pages are followed forward
    """
    results: list[RunOut]


class RunPlanOut(TypedDict):
    workflow: str
    help: str
    jobs: list[PlannedJobOut]
    estimate: str | None
    """
    USD: the most the run may cost (its jobs' max_cost); null if any is null
    """


class BackendOut(TypedDict):
    id: str
    name: str
    kind: BackendEnum
    status: BackendOutStatusEnum
    status_reason: str
    validated_at: str | None
    created_at: str
    auth: str
    """
    "role", "keys" (AWS), "kubeconfig", "in-cluster" (Kubernetes), or "" for backends without credentials.
    """
    regions: list[str]
    """
    AWS: its regions; Kubernetes: its cluster (the region its offers name).
    """
    bucket: str
    role_arn: str
    external_id: str
    aws_account_id: str
    kubernetes: KubernetesOut | None
    live_instances: int


class CompareOut(TypedDict):
    runs: list[ComparedRunOut]

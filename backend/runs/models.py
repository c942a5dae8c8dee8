"""Runs (one submission), their jobs, and the jobs' log lines."""

from __future__ import annotations

from typing import Any, ClassVar
from uuid import UUID

from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q, Value

from backend.accounts.models import WorkspaceOwnedModel, WorkspaceQuerySet
from backend.artifacts.models import StoredModel


class RunStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


class JobStatus(models.TextChoices):
    PENDING = "pending"  # waiting for a runner
    ASSIGNED = "assigned"  # offered to a runner under a lease
    RUNNING = "running"  # accepted: preparing, running or uploading
    STOPPING = "stopping"  # cancel sent to the runner
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


FINISHED_RUN = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED)
FINISHED_JOB = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
ACTIVE_JOB = (JobStatus.ASSIGNED, JobStatus.RUNNING, JobStatus.STOPPING)


class CodeKind(models.TextChoices):
    GIT = "git"
    ARCHIVE = "archive"


class Run(WorkspaceOwnedModel):
    name = models.CharField(max_length=100)
    workflow = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.PENDING)
    status_reason = models.CharField(max_length=1000, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    submitted_by = models.ForeignKey("accounts.User", null=True, on_delete=models.SET_NULL, related_name="+")
    repo = models.ForeignKey("repos.Repo", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    code_kind = models.CharField(max_length=16, choices=CodeKind.choices)
    repo_url = models.CharField(max_length=500, blank=True)
    commit = models.CharField(max_length=64, blank=True)
    patch_blob = models.ForeignKey("artifacts.Blob", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    archive_blob = models.ForeignKey(
        "artifacts.Blob", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The first workflows file (what a page shows); workflows_files: every
    # file the run was planned from, [{path, text}], sorted by path.
    # The workflow's ``help:`` when the run was submitted (dstack 0.x), shown with the run.
    help = models.CharField(max_length=1000, blank=True)
    workflows_file_path = models.CharField(max_length=300)
    workflows_file_text = models.TextField()
    workflows_files = models.JSONField(default=list, blank=True)
    env_overrides = models.JSONField(default=dict, blank=True)
    # What the CLI sent for the plan besides -e: values of bare env names
    # from its shell, the arguments after --, and each workflow's variables.
    inherited_env = models.JSONField(default=dict, blank=True)
    run_args = models.JSONField(default=list, blank=True)
    variables = models.JSONField(default=dict, blank=True)
    # The CLI's --backend/--region/--spot-policy/--max-price: they win over
    # every workflow's placement keys ({}: none).
    placement_overrides = models.JSONField(default=dict, blank=True)
    # The CLI's --gpu/--cpu/--memory/--disk as sent ({"gpu": "A10G:2", …}):
    # they replace every workflow's resources keys ({}: none).
    resource_overrides = models.JSONField(default=dict, blank=True)
    no_cache = models.BooleanField(default=False)
    # The submitter's values of -e and of bare env names (``env_overrides``
    # and ``inherited_env`` keep none since), and each job's share of them,
    # encrypted like secrets (``services.privateenv``): they are delivered
    # with the job's secrets and masked in its logs, never put in a frame.
    private_inputs = models.BinaryField(null=True, blank=True)
    # ``trainyard rerun``: the run this one repeats (its recorded locks installed);
    # the run page says "reproduced" when their artifacts match (docs/ENVIRONMENTS.md).
    # {requirements file: {path: sha256}} of the jobs' environments, as the CLI
    # read them from the working tree: names a changed file as the reason a
    # job is not reused, and lets --dry-run find a built environment.
    # db_default (here and on environment_build): rows written by raw SQL
    # (the benchmark's COPY, a test's seed) or by a process still on the
    # previous release get the default too.
    environment_files = models.JSONField(
        default=dict, blank=True, db_default=Value({}, output_field=models.JSONField())
    )
    # ``trainyard env build``: the run only builds (and stores) the workflow's
    # environment; its job has no commands (docs/ENVIRONMENTS.md, "Remote build").
    environment_build = models.BooleanField(default=False, db_default=False)
    rerun_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reruns")
    # The uncommitted files the patch touches, {path: sha256 of its part of
    # the patch}, as the CLI sent them; None when not sent (an API client):
    # only to name the files that differ in a cache decision, never hashed.
    patch_files = models.JSONField(null=True, blank=True, default=None)
    # The run's own cap on what it may cost, USD (``max_cost`` in the workflow
    # or ``--max-cost``); None: only the budgets cap it (docs/COST.md).
    max_cost = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    # An admin let it run past the workspace's and its submitter's budgets (audited).
    budget_override = models.BooleanField(default=False, db_default=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="uniq_run_name")]
        # The runs list's keyset order is (-created_at, -id) within a workspace:
        # one index per filter ends in that order, so a page (any page) is a
        # range read of at most page-size entries. Search (icontains, which
        # Django spells UPPER(col) LIKE UPPER(%q%)) uses trigram indexes on
        # the same expressions (docs/decisions/0049-runs-list-keyset.md).
        indexes = [
            models.Index(fields=["workspace", "-created_at", "-id"], name="run_ws_created_id"),
            models.Index(fields=["workspace", "status", "-created_at", "-id"], name="run_ws_status_created"),
            models.Index(fields=["workspace", "workflow", "-created_at", "-id"], name="run_ws_workflow_created"),
        ]
        # The trigram indexes (run_name_trgm, run_workflow_trgm) are made by
        # migration 0014 only where pg_trgm is available: not in model state.

    def __str__(self) -> str:
        return self.name

    @property
    def code_scope(self) -> str:
        """Which code a run's caches and packed environments belong to: its
        connected repository's id, or "" for code uploaded without one. A job
        restores only what a job of the same scope saved, so no member's run
        of one repository feeds another repository's jobs."""
        return str(self.repo_id) if self.repo_id else ""


def held_by(*, instance_id: UUID | str | None, attempt: int, via: str = "") -> Q:
    """Fencing, the one place it is written: a runner's frame or REST call
    about attempt ``attempt`` of a job is listened to only while that is the
    job's current attempt and it runs on the runner's own instance. A job
    moved to another runner, retried or fenced no longer matches, so a late
    or stolen runner changes nothing. ``via``: the path to the job
    (``"job__"`` from an attempt). No instance holds nothing: a runner not
    (or no longer) connected as an instance never matches a job whose
    instance was cleared."""
    if instance_id is None:
        return Q(pk__in=[])
    return Q(**{f"{via}instance_id": instance_id, f"{via}attempt": attempt})


class JobQuerySet(WorkspaceQuerySet):
    def held_by(self, *, instance_id: UUID | str | None, attempt: int) -> JobQuerySet:
        """The jobs whose current attempt ``attempt`` runs on ``instance_id`` (``held_by``)."""
        return self.filter(held_by(instance_id=instance_id, attempt=attempt))


class Job(WorkspaceOwnedModel):
    objects: ClassVar[Any] = JobQuerySet.as_manager()

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="jobs")
    name = models.CharField(max_length=200)
    workflow = models.CharField(max_length=200)
    # The resolved spec: commands, env, artifacts, resources, provider.
    spec = models.JSONField()
    cpu = models.PositiveIntegerField(null=True, blank=True)
    memory_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    gpu_count = models.PositiveIntegerField(default=0)
    gpu_name = models.CharField(max_length=100, blank=True)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)
    status_reason = models.CharField(max_length=1000, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    # The current (latest) attempt's number and instance: 0 / None before the first.
    attempt = models.PositiveIntegerField(default=0)
    instance = models.ForeignKey(
        "clouds.Instance", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    # The workflow's ``retry:`` as resolved at submission ({} when absent: the defaults).
    retry_policy = models.JSONField(default=dict, blank=True)
    # Where and how long it may run (``Workflow.placement()`` with the CLI's
    # overrides): backends, regions, spot_policy, max_price, max_wait,
    # idle_duration, max_duration ({}: the defaults). docs/RUNS.md, "Placement".
    placement = models.JSONField(default=dict, blank=True)
    # The most it is expected to cost, USD, from its cheapest offer's price
    # and its max_duration at submission; None: unbounded or unknown
    # (docs/COST.md, "Estimates"). The budgets' admission reads it.
    estimate_max_cost = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    # When subscriptions were told it waits for capacity (``job.waiting_capacity``);
    # None while it is not waiting that long, and again once it is assigned a machine.
    capacity_wait_told_at = models.DateTimeField(null=True, blank=True)
    # spot_policy auto: when (and why, in ``placement_note``) it gave up on spot.
    on_demand_since = models.DateTimeField(null=True, blank=True)
    placement_note = models.CharField(max_length=1000, blank=True)
    # Why the server itself stopped it (a TerminationReason, e.g. max_duration);
    # "" for a user's stop.
    stop_reason = models.CharField(max_length=32, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Failed because its artifacts could not be uploaded, its files kept on
    # its instance until then: that instance's runner may still upload this
    # attempt's artifacts (runs.api.runner_auth). None once they are
    # uploaded or removed, or when nothing was kept.
    kept_until = models.DateTimeField(null=True, blank=True)
    # Highest log seq stored: the de-duplication watermark (see runs.services.logs).
    last_seq = models.PositiveBigIntegerField(default=0)
    # Bytes of output stored (as the runner shipped it), against the
    # workspace's log cap; past the cap nothing more is stored, and
    # ``log_truncated_at`` is the seq of the one marker line saying so.
    log_bytes = models.PositiveBigIntegerField(default=0)
    log_truncated_at = models.PositiveBigIntegerField(null=True, blank=True)
    # What is wrong with the stored log, for people: the cap was reached,
    # the end-of-log check failed, retention removed it ("" when whole).
    log_note = models.CharField(max_length=1000, blank=True)
    # When retention deleted its lines (TRAINYARD_LOG_RETENTION_DAYS).
    log_pruned_at = models.DateTimeField(null=True, blank=True)
    # The DAG: jobs of the same run that must succeed first (their artifacts
    # are this job's inputs), and jobs that must be running (a master).
    needs = models.ManyToManyField("self", symmetrical=False, related_name="needed_by", blank=True)
    after_running = models.ManyToManyField("self", symmetrical=False, related_name="+", blank=True)
    ports = models.JSONField(default=list, blank=True)
    # Artifacts of other runs, resolved at submission:
    # [{"kind": "tag" | "run", "name": ..., "run_id": ...}].
    input_refs = models.JSONField(default=list, blank=True)
    cache_key = models.CharField(max_length=64, blank=True, db_index=True)
    # A job reused from cache points at the job that really ran (never a chain).
    cached_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reused_by")
    # Why it was reused or runs, decided when it became ready
    # (runs.lifecycle.cachewhy): {"reused": bool, "text": "runs: code changed
    # (train.py)", "reasons": [{"kind", "text"}]}; None before the decision
    # (nullable: a web process of the previous release still inserts jobs).
    cache_decision = models.JSONField(null=True, blank=True, default=None)
    # A Jupyter dev environment's token, encrypted (runs.lifecycle.devenvs); None for other jobs.
    app_token = models.BinaryField(null=True, blank=True)
    # When its Jupyter last saw activity, as its runner's heartbeats say (runs.services.devenvs).
    app_active_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["status", "created_at"], name="job_status_created"),
            # The log archive's and retention's passes walk jobs by when they ended.
            models.Index(fields=["finished_at"], name="job_finished_at", condition=models.Q(finished_at__isnull=False)),
            # The reconciler's pass over jobs whose files are kept (runs.lifecycle.kept).
            models.Index(fields=["kept_until"], name="job_kept_until", condition=models.Q(kept_until__isnull=False)),
            # A run's lineage: the jobs whose deps name a run (runs.services.lineage).
            GinIndex(
                fields=["input_refs"], name="job_input_refs", opclasses=["jsonb_path_ops"], condition=~Q(input_refs=[])
            ),
        ]


class AttemptStatus(models.TextChoices):
    ASSIGNED = "assigned"  # offered to a runner under a lease
    RUNNING = "running"  # the runner accepted and was confirmed
    STOPPING = "stopping"  # cancel sent
    ENDED = "ended"  # termination_reason says how


LIVE_ATTEMPT = (AttemptStatus.ASSIGNED, AttemptStatus.RUNNING, AttemptStatus.STOPPING)


class AttemptQuerySet(WorkspaceQuerySet):
    def current(self, *, job_id: UUID | str, number: int, instance_id: UUID | str | None) -> AttemptQuerySet:
        """Attempt ``number`` of the job, live, and the job's current one on
        ``instance_id`` (``held_by``): the attempt a runner's report may change."""
        return self.filter(job_id=job_id, number=number, status__in=LIVE_ATTEMPT).filter(
            held_by(instance_id=instance_id, attempt=number, via="job__")
        )


class Attempt(WorkspaceOwnedModel):
    """One try of a job on one instance. Only ``runs.lifecycle.transitions``
    writes its status. A runner's messages about a job name the attempt, and
    only the current attempt on its own instance is listened to (fencing:
    ``held_by``)."""

    objects: ClassVar[Any] = AttemptQuerySet.as_manager()

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    instance = models.ForeignKey(
        "clouds.Instance", null=True, blank=True, on_delete=models.SET_NULL, related_name="attempts"
    )
    status = models.CharField(max_length=16, choices=AttemptStatus.choices, default=AttemptStatus.ASSIGNED)
    lease = models.CharField(max_length=64, blank=True)
    # sha256 of the attempt's job token (``lifecycle.jobtoken``): the runner's
    # calls for the job carry it; "" for an attempt that never ran.
    job_token_hash = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    termination_reason = models.CharField(max_length=32, blank=True)  # runs.reasons.TerminationReason
    termination_message = models.CharField(max_length=1000, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # This attempt's lines are seqs first_seq..last_seq of the job's one log
    # (docs/decisions/0070-log-seqs-across-attempts.md).
    first_seq = models.PositiveBigIntegerField(default=1)
    last_seq = models.PositiveBigIntegerField(null=True, blank=True)
    # What the server received of this attempt's lines, to check against the
    # runner's final state: how many, and their digest (protocol.log_digest).
    log_lines = models.PositiveBigIntegerField(default=0)
    log_digest = models.CharField(max_length=64, blank=True)
    # Offers launched for this job before this attempt got its machine:
    # [{"offer": id, "instance": name, "outcome": reason, "message": …}].
    offers_tried = models.JSONField(default=list, blank=True)
    # The checkpoint version (its number) restored before this attempt's
    # commands started; None: it started without one.
    restored_checkpoint = models.PositiveIntegerField(null=True, blank=True)
    # An attempt ended ``interrupted`` at a spot notice still winds its job
    # down until the cloud's deadline: until then (or until its runner says
    # it is done) its runner may sync the checkpoint, and the job's next
    # attempt is not assigned (docs/decisions/0031-wind-down-hold.md).
    wind_down_until = models.DateTimeField(null=True, blank=True, db_index=True)
    # The key of the environment its commands ran in (``Environment``), "" for none.
    environment_key = models.CharField(max_length=24, blank=True, default="")
    # When the server last stored a log line of this attempt (set with the
    # tally of each stored batch, no write of its own): what ``stall`` reads.
    last_output_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="uniq_attempt_number")]
        indexes = [models.Index(fields=["status", "lease_expires_at"], name="attempt_status_lease")]


class Tag(WorkspaceOwnedModel):
    """A workspace-unique name for a successful run, usable in ``deps: - tag:``."""

    name = models.CharField(max_length=100)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="tags")
    created_by = models.ForeignKey("accounts.User", null=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="uniq_tag_name")]


class SubmissionKey(WorkspaceOwnedModel):
    """The ``Idempotency-Key`` a submission was sent with: the same key from
    the same person in the same workspace answers with ``run`` instead of
    making another run (``services/submissions.py``). ``digest``: the
    SHA-256 of the submission's body, so the key cannot name another one."""

    user = models.ForeignKey("accounts.User", on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    digest = models.CharField(max_length=64)
    # Set in the transaction that claimed the key, so never empty once committed.
    run = models.ForeignKey(Run, null=True, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "user", "key"], name="uniq_submission_key")]


class Environment(WorkspaceOwnedModel):
    """A job environment the workspace's runners built (docs/ENVIRONMENTS.md):
    one row per key, recorded from the first attempt that reports it; the
    attempts that ran in it name it by ``Attempt.environment_key``."""

    key = models.CharField(max_length=24)
    # The platform-free part of the key: sha256 of the spec and its files'
    # digests (``recipe_of``); what ``--dry-run`` looks an environment up by.
    recipe = models.CharField(max_length=64, blank=True)
    lock = models.TextField(blank=True)  # the resolved requirements, versions and hashes
    packages = models.TextField(blank=True)  # installed after the setup commands
    platform = models.JSONField(default=dict, blank=True)
    build_seconds = models.FloatField(default=0)
    size_bytes = models.BigIntegerField(default=0)
    built_on = models.CharField(max_length=100, blank=True)  # the instance that reported it first
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "key"], name="uniq_environment_key")]
        indexes = [models.Index(fields=["workspace", "recipe"], name="environment_ws_recipe")]

    @property
    def package_count(self) -> int:
        return sum(1 for line in self.packages.splitlines() if line.strip() and not line.startswith("#"))


class EnvironmentArchive(StoredModel):
    """An environment packed into the workspace's storage by the runner that
    built it, for runners on other machines to restore instead of building
    (docs/ENVIRONMENTS.md, "Shared through storage"). ``complete`` once the
    server saw the object at its announced size."""

    key = models.CharField(max_length=24)  # the environment's key
    # ``Run.code_scope`` of the job that packed it: only jobs of that scope restore it.
    code_scope = models.CharField(max_length=36, blank=True, default="")
    storage_key = models.CharField(max_length=500)
    size = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    complete = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    # Who packed it: the job (and the member who submitted its run).
    saved_by_job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    saved_by = models.ForeignKey("accounts.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "code_scope", "key"], name="uniq_environment_archive_scope")
        ]


class LogChunk(models.Model):
    """A run of consecutive lines of one job's output, stored as one row:
    seqs ``first_seq`` .. ``last_seq``, every one of them present. Storing
    a batch costs one row, not one per line, and reading a range back is
    a few rows whose text is already the plain log
    (docs/decisions/0054-log-chunks.md; ``services/logchunks.py`` reads
    and writes them).

    No surrogate id and no workspace column: tenancy is checked on the job.
    No database-level foreign key either: the writer locks the job row in
    the same transaction, and deleting a job cascades through the ORM.
    """

    pk = models.CompositePrimaryKey("job_id", "first_seq")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, db_constraint=False, related_name="+")
    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField()
    # One character per line: "o" (stdout) or "e" (stderr).
    streams = models.TextField()
    # Each line's time in Unix seconds: 8 bytes per line, float64 in
    # network byte order (as Postgres's float8send writes one).
    stamps = models.BinaryField()
    # The lines in UTF-8, each ended by "\n" (a line never holds one);
    # empty once archived: then they are ``size`` bytes at ``archive_offset``
    # in the job's LogArchive object.
    text = models.BinaryField()
    size = models.IntegerField()
    archive_offset = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["job", "last_seq"], name="logchunk_job_last_seq")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(last_seq__gte=models.F("first_seq")), name="logchunk_seqs_in_order"
            )
        ]


class LogArchive(StoredModel):
    """A finished job's log compacted into one object in the workspace's
    storage: its chunks' texts one after another (the plain log), each
    chunk's ``archive_offset`` saying where its lines are. The chunk rows
    keep the index: seqs, streams and times (services/logarchive.py)."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="log_archive")
    key = models.CharField(max_length=500)
    size = models.BigIntegerField()
    last_seq = models.BigIntegerField()  # the lines it holds end here (later ones stay in chunk rows)


# The run references besides a name or UUID (``runs_named``).
TAG_REF = "tag:"
LATEST_REF = "latest"


def runs_named(runs: models.QuerySet[Run], ref: str) -> models.QuerySet[Run]:
    """The run of ``runs`` (one workspace's) that ``ref`` names: its short
    name or UUID, ``tag:NAME`` (the run the tag points at) or
    ``WORKFLOW@latest`` (the workflow's newest run, whatever its status).
    Every endpoint that takes a run reads it through here, so every command
    and page takes all four."""
    if "\x00" in ref:  # no name has one, and Postgres refuses it (a websocket path is not checked by middleware)
        return runs.none()
    if ref.startswith(TAG_REF):
        return runs.filter(tags__name=ref.removeprefix(TAG_REF))
    workflow, at, which = ref.rpartition("@")
    if at and which == LATEST_REF:
        newest = runs.filter(workflow=workflow).order_by("-created_at", "-id").values("pk")[:1]
        return runs.filter(pk__in=models.Subquery(newest))
    try:
        return runs.filter(pk=UUID(ref))
    except ValueError:
        return runs.filter(name=ref)


def run_ref_missing(ref: str) -> str:
    """What a person is told when ``ref`` names no run of the workspace."""
    if ref.startswith(TAG_REF):
        return f"Tag {ref.removeprefix(TAG_REF)!r} not found (trainyard tag ls lists the workspace's tags)."
    workflow, at, which = ref.rpartition("@")
    if at and which == LATEST_REF:
        return f"Workflow {workflow!r} has no runs in this workspace."
    return f"Run {ref!r} not found."

"""Job environments as the workspace knows them (docs/ENVIRONMENTS.md).

A runner reports the environment a job's commands run in with the job's
``running`` state and again with its final one
(``protocol.EnvironmentReport``). ``environment_record`` keeps one
``Environment`` row per workspace and key (the first report's lock,
packages, size and build time; later ones only move ``last_used_at``) and
names the key on the attempt, only for the runner that holds that attempt.

A runner that built an environment packs it into the workspace's storage
(``environment_archive_begin`` / ``_done``: a signed PUT, then the object
checked at its size and sha256); a runner on another machine that meets the
key restores it from there (``environment_archive_find``) instead of
building it. Archives are keyed by workspace, the run's code scope (its
repository: ``Run.code_scope``) and environment key, and record the job and
member that packed them; an archive counts against the workspace's storage
quota from the moment its upload begins.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone
from trainyard_runner import protocol
from trainyard_spec.environments import recipe_of

from backend.artifacts.locations import location_of, storage_for_new, storage_of
from backend.artifacts.quota import charged, quota_check
from backend.artifacts.storage import Target, delete_after_commit
from backend.runs.models import Attempt, Environment, EnvironmentArchive, Job

logger = logging.getLogger(__name__)


def environment_record(*, job_id: str, instance_id: str, attempt: int, report: protocol.EnvironmentReport) -> bool:
    """Record ``report`` for the attempt ``attempt`` of ``job_id`` run by
    ``instance_id``; False (nothing stored) when that runner does not hold it."""
    row = (
        Attempt.objects.current(job_id=job_id, number=attempt, instance_id=instance_id)
        .select_related("instance", "job")
        .only("pk", "environment_key", "job__workspace_id", "instance__name")
        .first()
    )
    if row is None:
        return False
    workspace_id = row.job.workspace_id
    now = timezone.now()
    known = Environment.objects.filter(workspace_id=workspace_id, key=report.key)
    # ``recipe`` too: a row recorded before runners reported it gets it.
    if not known.update(last_used_at=now, **({"recipe": report.recipe} if report.recipe else {})):
        try:
            with transaction.atomic():
                Environment.objects.create(
                    workspace_id=workspace_id,
                    key=report.key,
                    recipe=report.recipe,
                    lock=report.lock,
                    packages=report.packages,
                    platform=report.platform,
                    build_seconds=report.build_seconds,
                    size_bytes=report.size_bytes,
                    built_on=row.instance.name if row.instance is not None else "",
                )
        except IntegrityError:
            pass  # another attempt recorded it first
    if row.environment_key != report.key:
        Attempt.objects.filter(pk=row.pk).update(environment_key=report.key)
    return True


# ------------------------------------------------------------ shared through storage

# An unfinished upload this old no longer blocks another runner's.
ARCHIVE_UPLOAD_SECONDS = 3600


@dataclass(frozen=True)
class ArchiveTarget:
    url: str
    size: int
    sha256: str


def environment_archive_find(*, job: Job, key: str) -> ArchiveTarget | None:
    """A signed GET of the packed environment ``key`` of the job's workspace
    and code scope, if one is complete."""
    found = _archives_of(job).filter(key=key, complete=True).first()
    if found is None:
        return None
    url = storage_of(found).signed_url(found.storage_key, method="GET")
    return ArchiveTarget(url=url, size=found.size, sha256=found.sha256)


def environment_archive_begin(*, job: Job, key: str, size: int, sha256: str) -> Target | None:
    """Where the runner PUTs ``key`` packed (``size`` bytes, ``sha256``) in
    the workspace's storage; None when it is there already or another runner
    is uploading it. Raises 413 (nothing recorded) when the workspace's
    storage quota has no room for it."""
    workspace_id = job.workspace_id
    with transaction.atomic():
        found = _archives_of(job).select_for_update().filter(key=key).first()
        stale = timezone.now() - timedelta(seconds=ARCHIVE_UPLOAD_SECONDS)
        if found is not None and (found.complete or found.created_at > stale):
            return None
        quota_check(workspace_id=workspace_id, requested=charged([size]) - (charged([found.size]) if found else 0))
        storage = storage_for_new(workspace_id=workspace_id)
        storage_key = f"{storage.key_root(workspace_id)}/environments/{key}-{uuid.uuid4().hex[:12]}.tar"
        if found is not None:
            found.delete()
            delete_after_commit(storage_of(found), [found.storage_key], "a replaced environment archive")
        EnvironmentArchive.objects.create(
            workspace_id=workspace_id,
            code_scope=job.run.code_scope,
            key=key,
            saved_by_job=job,
            saved_by_id=job.run.submitted_by_id,
            storage_key=storage_key,
            size=size,
            sha256=sha256,
            **location_of(storage),
        )
    return storage.upload_target(storage_key, sha256=sha256, size=size, seconds=ARCHIVE_UPLOAD_SECONDS)


def environment_archive_done(*, job: Job, key: str) -> str:
    """The runner finished the upload: "" when the object is there as
    announced (the archive is complete from now on), else what is wrong."""
    found = _archives_of(job).filter(key=key, complete=False).first()
    if found is None:
        return "no upload of this environment is under way"
    problem = storage_of(found).verify(found.storage_key, size=found.size, sha256=found.sha256, part_sha256s=[])
    if problem:
        return f"the packed environment is {problem}"
    EnvironmentArchive.objects.filter(pk=found.pk).update(complete=True)
    return ""


# ------------------------------------------------------------ before a job runs


def environment_outlook(
    *,
    workspace_id: uuid.UUID | str,
    workflow: str,
    environment: Mapping[str, object] | None,
    files: Mapping[str, str] | None,
) -> dict[str, object] | None:
    """``--dry-run``'s word on a job's environment (None without one):
    ``state`` "ready" (a runner of the workspace built this recipe: that
    machine reuses it; ``stored`` says whether others restore it rather than
    build), "to build", or "unknown" (the submitter sent no digests of its
    files); ``build_seconds``: that build's, or for "to build" the last
    build of an environment of the same workflow (None: never built)."""
    if not environment:
        return None
    if files is None:
        return {"state": "unknown", "key": "", "built_on": "", "stored": False, "build_seconds": None}
    recipe = recipe_of(environment, files)
    found = (
        Environment.objects.filter(workspace_id=workspace_id, recipe=recipe)
        .annotate(
            stored=Exists(
                EnvironmentArchive.objects.filter(workspace_id=workspace_id, key=OuterRef("key"), complete=True)
            )
        )
        .order_by("-stored", "-last_used_at")
        .only("key", "built_on", "build_seconds")
        .first()
    )
    if found is not None:
        return {
            "state": "ready",
            "key": found.key,
            "built_on": found.built_on,
            "stored": bool(found.stored),
            "build_seconds": found.build_seconds,
        }
    last = (
        Environment.objects.filter(
            workspace_id=workspace_id,
            key__in=Attempt.objects.filter(job__workspace_id=workspace_id, job__workflow=workflow)
            .exclude(environment_key="")
            .values("environment_key"),
        )
        .order_by("-created_at")
        .only("build_seconds")
        .first()
    )
    return {
        "state": "to build",
        "key": "",
        "built_on": "",
        "stored": False,
        "build_seconds": last.build_seconds if last is not None else None,
    }


def _archives_of(job: Job) -> QuerySet[EnvironmentArchive]:
    """The packed environments a job may restore or pack: its workspace's, of its run's code scope."""
    return EnvironmentArchive.objects.for_workspace(job.workspace).filter(code_scope=job.run.code_scope)

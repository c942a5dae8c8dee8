"""The run's DAG: when a job may start, what its inputs are, and the cache.

A job may start when every job it ``needs`` has succeeded (or was reused
from cache) and every job it runs ``after_running`` (a master) is running.
Its inputs are the complete artifacts of the jobs it needs and of the runs
its ``deps: - tag/run`` named, placed at the same relative paths.

The cache key of a job is a digest of the resolved spec, the code (commit +
patch digest, or archive digest) and the digests of its input files: an
earlier successful job of the workspace with the same key did exactly this
work, so its artifacts are reused instead of running again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from uuid import UUID

from backend.artifacts.models import Artifact, ArtifactStatus
from backend.runs.models import Job, JobStatus, Run

DONE = (JobStatus.SUCCEEDED,)
ENDED_BADLY = (JobStatus.FAILED, JobStatus.STOPPED)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str = ""  # why it waits, or why it can never run
    doomed: bool = False  # a dependency failed: the job fails too


def readiness(job: Job) -> Readiness:
    for dep in job.needs.all():
        if dep.status in ENDED_BADLY:
            return Readiness(False, f"dependency {dep.name} {dep.status}", doomed=True)
        if dep.status not in DONE:
            return Readiness(False, f"waiting for {dep.name} to finish")
    for master in job.after_running.all():
        if master.status in (JobStatus.SUCCEEDED, *ENDED_BADLY):
            return Readiness(False, f"{master.name} ended ({master.status}) before this job started", doomed=True)
        if master.status != JobStatus.RUNNING:
            return Readiness(False, f"waiting for {master.name} to start")
    return Readiness(True)


def effective(job: Job) -> Job:
    """The job that really ran: a cached job's source, else itself."""
    return job.cached_from if job.cached_from is not None else job


@dataclass(frozen=True)
class InputArtifact:
    artifact: Artifact
    origin: str  # "job download-base-model", "tag best-model (run brave-otter-3)"


def job_inputs(job: Job, *, files: bool = True) -> list[InputArtifact]:
    """The artifacts the job gets as inputs; ``files``: with their files
    prefetched (an input can hold 100k: only the cache key reads them all)."""
    inputs: list[InputArtifact] = []
    for dep in job.needs.all().select_related("cached_from"):
        source = effective(dep)
        found = _complete(Artifact.objects.filter(job=source), files=files)
        inputs += [InputArtifact(a, f"job {dep.name}") for a in found]
    for ref in job.input_refs:
        origin = ref_origin(ref)
        inputs += [InputArtifact(a, origin) for a in run_artifacts(run_id=ref["run_id"], files=files)]
    return inputs


def ref_origin(ref: dict[str, str]) -> str:
    """Where an input of ``deps: - tag/run/workflow owner/repo/name`` comes from, in words."""
    if ref["kind"] == "tag":
        return f"tag {ref['name']} (run {ref['run_name']})"
    if ref["kind"] == "workflow":
        return f"workflow {ref['name']} (run {ref['run_name']})"
    return f"run {ref['name']}"


def run_artifacts(*, run_id: UUID | str, files: bool = True) -> list[Artifact]:
    """The artifacts of a run's jobs, a cached job's through its source."""
    jobs = Job.objects.filter(run_id=run_id).select_related("cached_from")
    sources = [effective(j).pk for j in jobs]
    return _complete(Artifact.objects.filter(job_id__in=sources), files=files)


def code_identity(run: Run) -> str:
    if run.code_kind == "archive" and run.archive_blob is not None:
        return f"archive:{run.archive_blob.sha256}"
    patch = run.patch_blob.sha256 if run.patch_blob is not None else ""
    return f"git:{run.commit}+{patch}"


# Spec keys that never change what a job makes: what watches it (its log
# lines and samples read into metrics) and where its outputs are copied
# afterwards (``exports``: a reused job's artifacts are copied to the new
# run's destination). A change to them reuses the cached job all the same,
# and a miss never names them.
WATCH_ONLY_KEYS = frozenset({"metrics", "exports"})


def cache_key(*, spec: dict[str, object], code: str, inputs: list[InputArtifact]) -> str:
    files = sorted((i.artifact.path, f.path, f.sha256) for i in inputs for f in i.artifact.files.all())
    made_by = {k: v for k, v in spec.items() if k not in WATCH_ONLY_KEYS}
    payload = json.dumps({"spec": made_by, "code": code, "inputs": files}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def cacheable(*, spec: dict[str, object], after_running: bool) -> bool:
    """Only outputs are reused: a job without artifacts (``hello``) always
    runs, and parts of a live cluster (ports, workers) and dev environments
    are never reused; nor is a job with volumes (what it makes may be on them)."""
    live = spec.get("ports") or spec.get("dev_environment")
    return bool(spec.get("artifacts")) and not live and not after_running and not spec.get("volumes")


def cached_source(*, workspace_id: UUID | str, key: str, exclude: UUID | str | None = None) -> Job | None:
    """The newest job that succeeded with ``key`` and still has all its artifacts."""
    candidates = Job.objects.filter(workspace_id=workspace_id, cache_key=key, status=JobStatus.SUCCEEDED)
    if exclude is not None:
        candidates = candidates.exclude(pk=exclude)
    candidates = candidates.select_related("cached_from", "run").order_by("-finished_at")
    for candidate in candidates[:5]:
        source = effective(candidate)
        wanted = len(source.spec.get("artifacts", []))
        if Artifact.objects.filter(job=source, status=ArtifactStatus.COMPLETE).count() == wanted:
            return source
    return None


def _complete(artifacts: object, *, files: bool = True) -> list[Artifact]:
    complete = artifacts.filter(status=ArtifactStatus.COMPLETE).order_by("path")  # type: ignore[attr-defined]
    return list(complete.prefetch_related("files") if files else complete)

"""Every message and download URL the server sends a runner, built in one place.

The frames (``AssignJob``, ``CancelJob``, ``Refused``) go to the runner's
connection through the channel layer, once the transaction that decided
them has committed; a runner that is not connected gets nothing here and
learns at its next hello (its lease runs out, or the hello is answered).
No secret is ever put in a frame: it crosses the channel layer (Redis); the
runner fetches secrets over its authenticated REST calls
(``services.delivery``). Download URLs are signed for
``DOWNLOAD_URL_SECONDS`` and can be asked for again (``job_download_url``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from trainyard_runner import protocol

from backend.artifacts.caches import cache_file_url, cache_specs
from backend.artifacts.checkpoints import checkpoint_file_url, checkpoint_spec
from backend.artifacts.locations import storage_of
from backend.artifacts.models import Artifact, ArtifactFile, Blob
from backend.artifacts.services import artifact_file_key
from backend.clouds.models import Instance
from backend.clouds.services.volumes import VolumeNotAttached, volumes_attach_for
from backend.core.errors import NotFound
from backend.data.models import DataSnapshot
from backend.runs.events import send_to_channel
from backend.runs.lifecycle.dag import job_inputs
from backend.runs.lifecycle.jobtoken import job_token
from backend.runs.models import Attempt, Job, JobStatus, Run
from backend.runs.names import ssh_host_alias
from backend.runs.reasons import TerminationReason
from backend.vault.services import repo_credential_exists

logger = logging.getLogger(__name__)

# Signed URLs for a job's inputs and code: long enough for big downloads.
DOWNLOAD_URL_SECONDS = 6 * 3600


def assignment_send_isolated(attempt: Attempt) -> VolumeNotAttached | None:
    """One assignment that cannot be built or sent (a storage error, a bad
    row) must not keep the others of the pass, other tenants' among them,
    from going out: it is logged, and its lease runs out and the reconciler
    re-queues the job. A volume that could not be attached is returned: the
    caller ends the attempt with it (``scheduler.volumes.assignment_send``)."""
    try:
        attempt_send_assignment(attempt=attempt)
    except VolumeNotAttached as refused:
        return refused
    except Exception:
        logger.exception("attempt %s of job %s: the assignment could not be sent", attempt.number, attempt.job_id)
    return None


def attempt_send_assignment(*, attempt: Attempt) -> None:
    instance = attempt.instance
    if instance is None or not instance.channel_name:
        return  # the lease runs out and the reconciler re-queues the job
    # The job the assignment was made with (a pass's, a submission's) when it
    # is at hand with its run: what the frame reads of them does not change.
    at_hand = Attempt.job.is_cached(attempt) and Job.run.is_cached(attempt.job)
    job = attempt.job if at_hand else Job.objects.select_related("run").get(pk=attempt.job_id)
    frame = assign_frame(job, attempt, volumes=_volumes_attached(job, instance))
    send_to_channel(instance.channel_name, {"type": "runner.frame", "frame": frame.model_dump_json()})


# The budget's stop gives the commands this long after SIGTERM to write their
# checkpoint (announced in their interrupt file, as at a spot notice): with
# the sync after it, the stop fits in the one billing minute the budget may
# overshoot by (docs/COST.md, "What happens at each threshold").
BUDGET_STOP_GRACE = 30.0


def job_send_cancel(*, job: Job) -> None:
    instance = job.instance
    if instance is not None and instance.channel_name:
        grace = BUDGET_STOP_GRACE if job.stop_reason == TerminationReason.BUDGET_EXCEEDED else 0.0
        frame = protocol.CancelJob(job=str(job.pk), attempt=job.attempt, reason=job.status_reason, grace=grace)
        send_to_channel(instance.channel_name, {"type": "runner.frame", "frame": frame.model_dump_json()})


def job_cancel_on_commit(*, job_id: Any) -> None:
    """Once the caller commits, the runner of the job is told to stop it,
    if the job is still stopping then (its reason is the stop's)."""

    def send() -> None:
        job = Job.objects.select_related("instance").filter(pk=job_id, status=JobStatus.STOPPING).first()
        if job is not None:
            job_send_cancel(job=job)

    transaction.on_commit(send)


def attempt_refuse_on_commit(instance_id: str, job_id: str, number: int, why: str) -> None:
    channel = Instance.objects.filter(pk=instance_id).values_list("channel_name", flat=True).first()
    if not channel:
        return  # not connected: its next hello is answered with a refusal
    frame = protocol.Refused(job=job_id, attempt=number, reason=why[:500]).model_dump_json()
    transaction.on_commit(lambda: send_to_channel(channel, {"type": "runner.frame", "frame": frame}))


def _volumes_attached(job: Job, instance: Instance) -> list[protocol.VolumeMount]:
    """The job's volumes, attached to ``instance`` now (cloud calls: never in
    a transaction), as the runner mounts them. One that cannot be attached
    keeps the assignment from being sent (``VolumeNotAttached``)."""
    wanted = job.spec.get("volumes") or []
    if not wanted:
        return []
    mounts = volumes_attach_for(job_id=job.pk, instance=instance, wanted=wanted)
    return [protocol.VolumeMount.model_validate(dataclasses.asdict(m)) for m in mounts]


def assign_frame(
    job: Job, attempt: Attempt, *, volumes: list[protocol.VolumeMount] | None = None
) -> protocol.AssignJob:
    run: Run = job.run
    spec = job.spec
    ran_before = (
        attempt.number > 1
        and Attempt.objects.filter(job_id=job.pk, number__lt=attempt.number).exclude(started_at=None).exists()
    )
    resumed = {"TRAINYARD_RESUMED": "1"} if ran_before else {}
    # No secret in the frame: it crosses the channel layer (Redis, on disk).
    # The runner fetches them (``delivery.job_secrets``); the job's own env wins over them.
    env = {
        **spec["env"],
        **_master_env(job),
        "TRAINYARD_RUN_NAME": run.name,
        "TRAINYARD_JOB_ID": str(job.pk),
        "TRAINYARD_JOB_NAME": job.name,
        "TRAINYARD_ATTEMPT": str(attempt.number),
        **resumed,
        **_dev_environment_env(job, run),
    }
    return protocol.AssignJob(
        job=str(job.pk),
        attempt=attempt.number,
        seq_base=attempt.first_seq - 1,
        lease=attempt.lease,
        lease_seconds=settings.TRAINYARD["LEASE_SECONDS"],
        run_name=run.name,
        workflow=job.workflow,
        commands=spec["commands"],
        env=env,
        code=_code_spec(run),
        artifacts=[protocol.ArtifactSpec(path=p, mount=p in spec.get("mounts", ())) for p in spec["artifacts"]],
        api_url=f"{settings.PUBLIC_URL}/api/v1",
        inputs=_inputs(job),
        data=_data(job),
        provider=spec.get("provider", "bash"),
        image=spec.get("image", ""),
        checkpoint=_checkpoint(job, attempt),
        port_count=int(spec.get("port_count", 0)),
        mount_seconds=settings.TRAINYARD["MOUNT_SYNC_SECONDS"],
        caches=cache_specs(job=job),
        environment=protocol.EnvironmentSpec.model_validate(spec["environment"]) if spec.get("environment") else None,
        # Secrets, the submitter's private values or a clone credential: fetched over REST.
        secrets=bool(spec.get("secrets") or spec.get("private_env") or job.app_token is not None)
        or repo_credential_exists(workspace_id=run.workspace_id, repo_id=run.repo_id),
        keep_running_server_lost=spec.get("on_server_lost") == "keep-running",
        # Only for an attempt that stores its hash (one assigned before the job token has none).
        job_token=job_token(lease=attempt.lease) if attempt.job_token_hash else "",
        volumes=volumes or [],
        **_metrics(spec),
    )


def _data(job: Job) -> list[protocol.DataInput]:
    """The job's data inputs as listed at submission; the runner pages
    through their files over REST (``GET …/runner/jobs/<job>/data/``)."""
    items = job.spec.get("data") or []
    if not items:
        return []
    digests = [str(i["snapshot"]) for i in items]
    found = {s.digest: s for s in DataSnapshot.objects.filter(workspace_id=job.workspace_id, digest__in=digests)}
    return [
        protocol.DataInput(
            uri=str(item["uri"]),
            path=str(item["path"]),
            snapshot=str(item["snapshot"]),
            file_count=found[str(item["snapshot"])].file_count,
            total_size=found[str(item["snapshot"])].total_size,
            read_only=bool(item.get("read_only", True)),
        )
        for item in items
    ]


def _metrics(spec: dict[str, Any]) -> dict[str, Any]:
    """The workflow's ``metrics:`` for the runner; the protocol's defaults where it says nothing."""
    found = spec.get("metrics") or {}
    fields: dict[str, Any] = {
        "metrics": [protocol.MetricPattern(name=p["name"], regex=p["regex"]) for p in found.get("patterns") or []]
    }
    if found.get("interval"):
        fields["metrics_interval"] = float(found["interval"])
    if found.get("per_minute"):
        fields["metrics_per_minute"] = int(found["per_minute"])
    return fields


def _dev_environment_env(job: Job, run: Run) -> dict[str, str]:
    """A dev environment's ``TRAINYARD_SSH_HOST``: the host its ``code --remote`` line names."""
    if "dev_environment" not in job.spec:
        return {}
    return {"TRAINYARD_SSH_HOST": ssh_host_alias(run.name, job.name, jobs_in_run=run.jobs.count())}


def _checkpoint(job: Job, attempt: Attempt) -> protocol.CheckpointSpec | None:
    """The job's checkpoint path and the latest version to restore, if an
    earlier attempt synced one (recorded on the attempt: the API shows it)."""
    found = checkpoint_spec(job=job)
    if found is not None and found.version:
        Attempt.objects.filter(pk=attempt.pk).update(restored_checkpoint=found.version)
    return found


def _master_env(job: Job) -> dict[str, str]:
    master = job.after_running.select_related("instance").first()
    if master is None or master.instance is None:
        return {}
    host = master.instance.address or master.instance.hostname or "127.0.0.1"
    port = str(master.ports[0]) if master.ports else ""
    return {"TRAINYARD_MASTER_HOST": host, "TRAINYARD_MASTER_PORT": port}


def _inputs(job: Job) -> list[protocol.InputArtifact]:
    """The inputs' paths and sizes in files: their manifests are fetched
    page by page (``delivery.job_input_page``), so a 50k-file input does not
    make a frame the runner refuses."""
    return [
        protocol.InputArtifact(path=i.artifact.path, file_count=i.artifact.files.count())
        for i in job_inputs(job, files=False)
    ]


def _code_spec(run: Run) -> protocol.CodeSpec:
    if run.code_kind == "archive":
        assert run.archive_blob is not None
        return protocol.CodeSpec(kind="archive", archive_url=_blob_url(run.archive_blob))
    patch_url = _blob_url(run.patch_blob) if run.patch_blob else ""
    return protocol.CodeSpec(kind="git", repo_url=run.repo_url, commit=run.commit, patch_url=patch_url)


def job_download_url(
    *, job: Job, code: str = "", input_path: str = "", file_path: str = "", checkpoint: int = 0, cache: str = ""
) -> str:
    """A fresh URL for something the job's AssignJob names: its code
    (``code`` "archive" or "patch") or an input file (``input_path`` as in
    ``InputArtifact.path``, ``file_path`` as in ``InputFile.path``). The
    runner asks when a URL has expired (S3 URLs live 15 minutes)."""
    run = job.run
    if checkpoint:
        return checkpoint_file_url(job=job, number=checkpoint, file_path=file_path)
    if cache:
        return cache_file_url(job=job, path=cache, file_path=file_path)
    if code:
        blob = {"archive": run.archive_blob, "patch": run.patch_blob}.get(code)
        if blob is None:
            raise NotFound(f"This job has no {code!r} to download.")
        return _blob_url(blob)
    for i in job_inputs(job, files=False):
        if i.artifact.path == input_path:
            file = i.artifact.files.filter(path=file_path).first()
            if file is not None:
                return input_url(i.artifact, file)
    raise NotFound(f"Input {input_path}/{file_path} is not an input of this job.")


def input_url(artifact: Artifact, file: ArtifactFile) -> str:
    """A signed GET URL of an input file, for the job's runner."""
    return storage_of(artifact).signed_url(
        artifact_file_key(artifact, file), method="GET", seconds=DOWNLOAD_URL_SECONDS
    )


def _blob_url(blob: Blob) -> str:
    return storage_of(blob).signed_url(blob.storage_key, method="GET", seconds=DOWNLOAD_URL_SECONDS)

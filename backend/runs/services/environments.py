"""Job environments as the workspace knows them (docs/ENVIRONMENTS.md).

A runner reports the environment a job's commands run in with the job's
``running`` state and again with its final one
(``protocol.EnvironmentReport``). ``environment_record`` keeps one
``Environment`` row per workspace and key (the first report's lock,
packages, size and build time; later ones only move ``last_used_at``) and
names the key on the attempt, only for the runner that holds that attempt.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone
from trainyard_runner import protocol

from backend.runs.models import Attempt, Environment, Job


def environment_record(*, job_id: str, instance_id: str, attempt: int, report: protocol.EnvironmentReport) -> bool:
    """Record ``report`` for the attempt ``attempt`` of ``job_id`` run by
    ``instance_id``; False (nothing stored) when that runner does not hold it."""
    row = (
        Attempt.objects.filter(job_id=job_id, number=attempt, instance_id=instance_id)
        .select_related("instance")
        .only("pk", "environment_key", "job__workspace_id", "instance__name")
        .first()
    )
    if row is None:
        return False
    workspace_id = Job.objects.filter(pk=job_id).values_list("workspace_id", flat=True).first()
    if workspace_id is None:
        return False
    now = timezone.now()
    if not Environment.objects.filter(workspace_id=workspace_id, key=report.key).update(last_used_at=now):
        try:
            with transaction.atomic():
                Environment.objects.create(
                    workspace_id=workspace_id,
                    key=report.key,
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

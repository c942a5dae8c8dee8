"""Backfill: one attempt for every existing job that was given to a runner.

Its lease, instance, times, exit code and log range come from the job; a
finished job's attempt ends with the reason its status implies. Jobs that
never reached a runner (pending, failed on a dependency, reused from the
cache) get no attempt and ``attempt = 0``.
"""

from django.db import migrations

ENDED = {"succeeded": "done", "failed": "error", "stopped": "stopped_by_user"}
LIVE = {"assigned": "assigned", "running": "running", "stopping": "stopping"}


def forwards(apps, schema_editor):
    Job = apps.get_model("runs", "Job")
    Attempt = apps.get_model("runs", "Attempt")
    ran = Job.objects.exclude(instance=None) | Job.objects.exclude(started_at=None).filter(cached_from=None)
    attempts = []
    for job in ran.distinct().iterator(chunk_size=1000):
        status = LIVE.get(job.status, "ended")
        attempts.append(
            Attempt(
                workspace_id=job.workspace_id,
                job_id=job.pk,
                number=1,
                instance_id=job.instance_id,
                status=status,
                lease=job.lease,
                lease_expires_at=job.lease_expires_at,
                termination_reason=ENDED.get(job.status, "") if status == "ended" else "",
                termination_message=job.status_reason[:1000] if status == "ended" else "",
                exit_code=job.exit_code,
                started_at=job.started_at,
                finished_at=job.finished_at,
                first_seq=1,
                last_seq=job.last_seq if status == "ended" else None,
            )
        )
    Attempt.objects.bulk_create(attempts, batch_size=1000)
    Job.objects.filter(pk__in=[a.job_id for a in attempts]).update(attempt=1)
    Job.objects.exclude(pk__in=[a.job_id for a in attempts]).update(attempt=0)


def backwards(apps, schema_editor):
    apps.get_model("runs", "Attempt").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("runs", "0004_attempts")]

    operations = [migrations.RunPython(forwards, backwards)]

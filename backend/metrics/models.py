"""A job's metrics, per attempt, in blocks (docs/METRICS.md).

System samples are stored as ``SystemBlock`` rows, each one attempt's
samples within one hour (``bucket``): as the runner's frames brought them
(``FRAME``), packed into one row for the hour (``RAW``), and, once older
than ``TRAINYARD_METRICS_RAW_HOURS``, as min/mean/max per minute
(``MINUTES``). Training values are ``TrainingBlock`` rows, one metric of
one attempt each, keyed by step or by time. ``AttemptMetrics`` holds an
attempt's counters, its series' names, its last values and what the
de-duplication needs. The rows go with their job (cascade) and are read
through the job, whose run says the workspace: no workspace column.

The blocks have no database-level foreign key (as ``runs.LogChunk``): a
frame's insert then takes no lock on the job's and the attempt's rows,
which log batches and state changes lock; it is written only after its
attempt was found current in the same transaction, and deleting a job or
an attempt cascades through the ORM.
"""

from __future__ import annotations

from django.db import models


class Level(models.IntegerChoices):
    FRAME = 0, "frame"  # samples of one frame within one hour, as received
    RAW = 1, "raw"  # every sample of one hour, packed
    MINUTES = 2, "1m"  # min/mean/max (and count) per minute of one hour


class AttemptMetrics(models.Model):
    """One attempt's metrics at a glance; its row lock orders the writers
    of the attempt's blocks (ingestion, compaction)."""

    attempt = models.OneToOneField("runs.Attempt", primary_key=True, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey("runs.Job", on_delete=models.CASCADE, related_name="+")
    number = models.PositiveIntegerField()
    # Training values over the job's per-minute cap (the runner's count), lines
    # of the metrics file that were not a JSON object of numbers, frames the
    # server dropped (faster than its rate cap, or queued past its bound), and
    # values or samples received again (not newer than the attempt's last).
    dropped = models.PositiveBigIntegerField(default=0)
    malformed = models.PositiveBigIntegerField(default=0)
    frames_dropped = models.PositiveBigIntegerField(default=0)
    repeated = models.PositiveBigIntegerField(default=0)
    system_names = models.JSONField(default=list)
    training_names = models.JSONField(default=list)
    # {name: {"value", "step", "t"}}: the latest sample's values and each
    # training metric's latest value (by its time).
    last = models.JSONField(default=dict)
    # {name: {"step": highest step, "t": latest time of a value without one}}:
    # a training value is stored only past these (a resend is not stored twice).
    marks = models.JSONField(default=dict)
    last_sample_at = models.DateTimeField(null=True, blank=True)  # the latest sample's time (the runner's clock)
    last_value_at = models.DateTimeField(null=True, blank=True)  # when a new training value was last stored (server)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["job", "number"], name="attemptmetrics_job")]


class SystemBlock(models.Model):
    """Samples of one attempt within one hour. ``names`` are its series;
    ``data`` (``backend.metrics.blocks``) holds ``count`` times and, per
    series, a value each (``FRAME``, ``RAW``) or a count, min, mean and max
    per minute (``MINUTES``)."""

    id = models.BigAutoField(primary_key=True)
    attempt = models.ForeignKey("runs.Attempt", on_delete=models.CASCADE, db_constraint=False, related_name="+")
    job = models.ForeignKey("runs.Job", on_delete=models.CASCADE, db_constraint=False, related_name="+")
    number = models.PositiveIntegerField()
    level = models.PositiveSmallIntegerField(choices=Level.choices, default=Level.FRAME)
    bucket = models.DateTimeField()  # the hour its samples are in
    t_first = models.DateTimeField()
    t_last = models.DateTimeField()
    count = models.PositiveIntegerField()
    names = models.JSONField()
    data = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["job", "t_last"], name="systemblock_job_t"),
            models.Index(fields=["attempt", "t_last"], name="systemblock_attempt_t"),
            # Compaction's passes: frames to pack, raw hours to downsample.
            models.Index(fields=["created_at"], name="systemblock_frames", condition=models.Q(level=Level.FRAME)),
            models.Index(fields=["bucket"], name="systemblock_raw", condition=models.Q(level=Level.RAW)),
        ]


class TrainingBlock(models.Model):
    """Values of one training metric of one attempt, keyed by step
    (``by_step``) or by time, in key order within the block: ``count``
    times, steps (``by_step``) and values (``backend.metrics.blocks``)."""

    id = models.BigAutoField(primary_key=True)
    attempt = models.ForeignKey("runs.Attempt", on_delete=models.CASCADE, db_constraint=False, related_name="+")
    job = models.ForeignKey("runs.Job", on_delete=models.CASCADE, db_constraint=False, related_name="+")
    number = models.PositiveIntegerField()
    name = models.CharField(max_length=64)
    by_step = models.BooleanField()
    packed = models.BooleanField(default=False)
    t_first = models.DateTimeField()
    t_last = models.DateTimeField()
    count = models.PositiveIntegerField()
    data = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["job", "name", "t_last"], name="trainingblock_job_name_t"),
            models.Index(fields=["created_at"], name="trainingblock_frames", condition=models.Q(packed=False)),
        ]

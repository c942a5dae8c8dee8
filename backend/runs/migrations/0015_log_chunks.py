"""Log lines move from one row per line (runs_logline) to one row per run
of consecutive lines (runs_logchunk): docs/decisions/0054-log-chunks.md.

The lines already stored are copied into chunks of at most 1,000 lines, each
chunk an unbroken run of seqs (a log cut by its cap has a gap), and back
again on reverse."""

import uuid

import django.db.models.deletion
from django.db import migrations, models

# "island": lines with no gap between them share seq - row_number().
TO_CHUNKS = """
INSERT INTO runs_logchunk (job_id, first_seq, last_seq, streams, stamps, text, size)
SELECT job_id, first_seq, last_seq, streams, stamps, text, octet_length(text) FROM (
    SELECT job_id, min(seq) AS first_seq, max(seq) AS last_seq,
           string_agg(stream, '' ORDER BY seq) AS streams,
           string_agg(float8send(extract(epoch FROM ts)::float8), ''::bytea ORDER BY seq) AS stamps,
           string_agg(convert_to(replace(text, E'\\n', U&'\\2424') || E'\\n', 'UTF8'), ''::bytea ORDER BY seq) AS text
    FROM (
        SELECT job_id, seq, ts, stream, text, seq - row_number() OVER (PARTITION BY job_id ORDER BY seq) AS island
        FROM runs_logline
    ) numbered
    GROUP BY job_id, island, (seq - 1) / 1000
) chunks
"""

TO_LINES = """
INSERT INTO runs_logline (job_id, seq, ts, stream, text)
SELECT c.job_id, c.first_seq + l.n - 1, to_timestamp(pg_temp.float8_of(substring(c.stamps FROM 8 * l.n::int - 7 FOR 8))),
       substr(c.streams, l.n::int, 1), l.line
FROM runs_logchunk c,
     LATERAL regexp_split_to_table(convert_from(c.text, 'UTF8'), E'\\n') WITH ORDINALITY AS l(line, n)
WHERE l.n <= c.last_seq - c.first_seq + 1
"""

# float8send's 8 bytes back to the number (SQL has no cast for it): sign,
# exponent and fraction of the IEEE 754 double (the times are normal numbers).
FLOAT8_OF = """
CREATE OR REPLACE FUNCTION pg_temp.float8_of(raw bytea) RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN bits = 0 THEN 0::float8 ELSE
        (CASE WHEN bits < 0 THEN -1 ELSE 1 END)
        * (1 + (bits & 4503599627370495)::float8 / 4503599627370496)
        * power(2::float8, ((bits >> 52) & 2047) - 1023)
    END
    FROM (SELECT ('x' || encode(raw, 'hex'))::bit(64)::bigint AS bits) b
$$
"""


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0005_workspace_log_cap"),
        ("clouds", "0008_instance_cloud_view"),
        ("runs", "0014_runs_list_keyset_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="LogArchive",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                ("storage_bucket", models.CharField(blank=True, max_length=63)),
                ("key", models.CharField(max_length=500)),
                ("size", models.BigIntegerField()),
                ("last_seq", models.BigIntegerField()),
                (
                    "job",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE, related_name="log_archive", to="runs.job"
                    ),
                ),
                (
                    "storage_account",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="clouds.cloudaccount",
                    ),
                ),
                (
                    "workspace",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="accounts.workspace"
                    ),
                ),
            ],
            options={
                "abstract": False,
            },
        ),
        migrations.CreateModel(
            name="LogChunk",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "job_id", "first_seq", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("first_seq", models.BigIntegerField()),
                ("last_seq", models.BigIntegerField()),
                ("streams", models.TextField()),
                ("stamps", models.BinaryField()),
                ("text", models.BinaryField()),
                ("size", models.IntegerField()),
                ("archive_offset", models.BigIntegerField(blank=True, null=True)),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="runs.job",
                    ),
                ),
            ],
        ),
        migrations.RunSQL(TO_CHUNKS, reverse_sql=[FLOAT8_OF, TO_LINES]),
        migrations.DeleteModel(
            name="LogLine",
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)), fields=["finished_at"], name="job_finished_at"
            ),
        ),
        migrations.AddIndex(
            model_name="logchunk",
            index=models.Index(fields=["job", "last_seq"], name="logchunk_job_last_seq"),
        ),
        migrations.AddConstraint(
            model_name="logchunk",
            constraint=models.CheckConstraint(
                condition=models.Q(("last_seq__gte", models.F("first_seq"))), name="logchunk_seqs_in_order"
            ),
        ),
    ]

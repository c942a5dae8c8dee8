"""A run keeps every workflows file it was planned from and what the CLI sent for
the plan besides -e (bare env values, the arguments after --, variables).
No backfill: a run from before has [] and is re-run from its one file
(workflows_file_path/_text), see runs.services.run_rerun."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_attempt_wind_down_until"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="inherited_env",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="run",
            name="run_args",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="run",
            name="variables",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="run",
            name="workflows_files",
            field=models.JSONField(blank=True, default=list),
        ),
    ]

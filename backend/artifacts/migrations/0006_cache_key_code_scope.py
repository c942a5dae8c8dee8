"""Cache savings keyed by code scope too (``Run.code_scope``): each existing
saving takes the scope of the run that saved it, so it is restored only to
jobs of that repository."""

from django.db import migrations


def _scope_cache_keys(apps, schema_editor):
    schema_editor.execute(
        """
        UPDATE artifacts_artifact a
        SET cache_key = COALESCE(r.repo_id::text, '') || E'\\n' || a.cache_key
        FROM runs_run r
        WHERE a.kind = 'cache' AND a.run_id = r.id
        """
    )


def _unscope_cache_keys(apps, schema_editor):
    schema_editor.execute(
        "UPDATE artifacts_artifact SET cache_key = substr(cache_key, strpos(cache_key, E'\\n') + 1) WHERE kind = 'cache'"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("artifacts", "0005_replace_on_complete_and_caches"),
        ("runs", "0021_environment_archive_code_scope"),
    ]

    operations = [migrations.RunPython(_scope_cache_keys, _unscope_cache_keys)]

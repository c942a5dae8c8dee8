"""Contract: the lease lives on the attempt now."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0005_backfill_attempts")]

    operations = [
        migrations.RemoveField(model_name="job", name="lease"),
        migrations.RemoveField(model_name="job", name="lease_expires_at"),
    ]

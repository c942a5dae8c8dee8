from __future__ import annotations

from typing import Any

from django.db import migrations, models
from django.db.models import F, Q


def backfill(apps: Any, schema_editor: Any) -> None:
    """Existing machines are billed from their first hello, on the market their offer named."""
    Instance = apps.get_model("clouds", "Instance")
    Instance.objects.filter(running_at__isnull=True).update(running_at=F("connected_at"))
    sold = ~Q(backend__in=["local", "self-hosted"])
    Instance.objects.filter(sold, spot=True).update(market="spot")
    Instance.objects.filter(sold, spot=False).update(market="on-demand")


class Migration(migrations.Migration):
    dependencies = [("clouds", "0012_volumes")]

    operations = [
        migrations.AddField(
            model_name="instance", name="price_source", field=models.CharField(blank=True, max_length=100)
        ),
        migrations.AddField(model_name="instance", name="market", field=models.CharField(blank=True, max_length=16)),
        migrations.AddField(
            model_name="instance", name="running_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]

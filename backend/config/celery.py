"""The Celery app: broker from settings, tasks discovered from the apps."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backend.config.settings")

app = Celery("trainyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from __future__ import annotations

from backend.config.celery import app as celery_app

__all__ = ["celery_app"]

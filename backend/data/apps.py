"""The data app: datasets a job reads from outside Trainyard (``s3://``,
``https://``), listed when their run is submitted (``DataSnapshot``), and the
workspace's S3-compatible endpoint (``DataEndpoint``). ``backend.runs``
calls its services; this app imports nothing of ``backend.runs`` but its
models (docs/DATA.md)."""

from __future__ import annotations

from django.apps import AppConfig


class DataConfig(AppConfig):
    name = "backend.data"
    label = "data"

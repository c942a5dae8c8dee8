"""GET /api/v1/health/: up, and the limits a client checks before an upload."""

from __future__ import annotations

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_health_answers_anyone_with_the_largest_blob_the_server_accepts() -> None:
    from django.conf import settings

    with override_settings(TRAINYARD={**settings.TRAINYARD, "MAX_BLOB_BYTES": 12345}):
        response = APIClient().get("/api/v1/health/")

    assert (response.status_code, response.json()) == (200, {"status": "ok", "max_blob_bytes": 12345})

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_the_openapi_schema_builds_and_validates_without_warnings(tmp_path: Path) -> None:
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    text = out.read_text()
    assert "/api/v1/workspaces/{workspace}/runs/" in text
    assert "bearerAuth" in text


def test_the_api_docs_page_serves_swagger_from_our_own_static_files(client: object) -> None:
    response = client.get("/api/v1/docs/")  # type: ignore[attr-defined]
    body = response.content.decode()
    assert response.status_code == 200
    assert "drf_spectacular_sidecar/swagger-ui-dist" in body
    assert "cdn.jsdelivr.net" not in body

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from openapi_spec_validator import OpenAPIV30SpecValidator

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_the_openapi_schema_builds_and_validates_without_warnings(tmp_path: Path) -> None:
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    text = out.read_text()
    assert "/api/v1/workspaces/{workspace}/runs/" in text
    assert "bearerAuth" in text


@pytest.mark.django_db
def test_the_generated_schema_is_a_valid_openapi_document(tmp_path: Path) -> None:
    """Every default must satisfy its own schema (a blank default with minLength 1 did not),
    or clients and the fuzzer (tests/core/test_fuzz_api.py) generate from a contradiction."""
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--file", str(out))

    errors = [str(e).splitlines()[0] for e in OpenAPIV30SpecValidator(yaml.safe_load(out.read_text())).iter_errors()]

    assert errors == []


def test_the_committed_schema_is_a_valid_openapi_document() -> None:
    committed = yaml.safe_load((REPO_ROOT / "frontend" / "openapi.yaml").read_text())

    assert [str(e).splitlines()[0] for e in OpenAPIV30SpecValidator(committed).iter_errors()] == []


def test_the_api_docs_page_serves_swagger_from_our_own_static_files(client: object) -> None:
    response = client.get("/api/v1/docs/")  # type: ignore[attr-defined]
    body = response.content.decode()
    assert response.status_code == 200
    assert "drf_spectacular_sidecar/swagger-ui-dist" in body
    assert "cdn.jsdelivr.net" not in body

"""Issue 11, item 14: a JSON body over Django's DATA_UPLOAD_MAX_MEMORY_SIZE
is answered 413 in the API's error format, not 500."""

from __future__ import annotations

import json
from typing import Any

from backend.accounts.models import Workspace
from tests.support.fixtures import Person


def test_an_oversized_json_body_is_413_with_the_limit(team: Workspace, owner: Person, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = json.dumps({"name": "x", "value": "v" * 20_000})
    answer = owner.client().generic(
        "PUT", f"/api/v1/workspaces/{team.slug}/secrets/BIG/", body, content_type="application/json"
    )
    assert answer.status_code == 413, answer.content
    assert answer.json() == {
        "message": "The request body is larger than the 10,000 bytes this endpoint takes.",
        "extra": {"limit_bytes": 10_000},
    }

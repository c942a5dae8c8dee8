"""``trainyard data endpoint`` and the dry run's data lines, the CLI talking
to the real API in this process (httpx's WSGI transport into Django, real
Postgres)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from trainyard.output import plan_lines

from backend.accounts.models import Workspace
from backend.data.models import DataEndpoint
from backend.vault.crypto import decrypt
from tests.support.cli_wsgi import cli_as as _as
from tests.support.cli_wsgi import cli_invoke as _invoke
from tests.support.cli_wsgi import in_the_tests_transaction
from tests.support.fixtures import Person


@pytest.fixture(autouse=True)
def _in_the_tests_transaction() -> Iterator[None]:
    with in_the_tests_transaction():
        yield


def test_an_admin_sets_the_endpoint_with_the_secret_from_stdin_and_it_is_never_shown(
    monkeypatch: pytest.MonkeyPatch, team: Workspace, owner: Person, settings: Any
) -> None:
    settings.ALLOWED_HOSTS = ["*"]
    _as(monkeypatch, team, owner)

    code, out, err = _invoke(
        "data", "endpoint", "set", "https://minio.example.com:9000", "--access-key-id", "trainyard", stdin="s3cr3t\n"
    )
    shown = _invoke("data", "endpoint", "show")
    as_json = _invoke("data", "endpoint", "show", "--json")

    assert (code, out) == (0, "")
    assert "Data endpoint of acme set to https://minio.example.com:9000" in err
    stored = DataEndpoint.objects.get(workspace=team)
    assert decrypt(bytes(stored.secret_access_key_ciphertext)) == "s3cr3t"
    assert shown[1].splitlines() == [
        "endpoint:      https://minio.example.com:9000",
        "region:        us-east-1 (default)",
        "access key id: trainyard",
        "secret:        set (never shown)",
    ]
    assert "s3cr3t" not in as_json[1] and '"has_secret": true' in as_json[1]
    assert _invoke("data", "endpoint", "rm")[2] == "Removed the data endpoint of acme\n"
    assert not DataEndpoint.objects.filter(workspace=team).exists()


def test_a_member_may_read_but_not_set_it_and_a_bad_url_is_named(
    monkeypatch: pytest.MonkeyPatch, team: Workspace, owner: Person, member: Person, settings: Any
) -> None:
    settings.ALLOWED_HOSTS = ["*"]
    _as(monkeypatch, team, owner)
    bad = _invoke("data", "endpoint", "set", "ftp://files.example.com")
    _as(monkeypatch, team, member)
    refused = _invoke("data", "endpoint", "set", "https://minio.example.com")
    none = _invoke("data", "endpoint", "show")

    assert bad[0] == 1 and "is not an http(s) URL such as https://minio.example.com:9000" in bad[2]
    assert refused[0] == 1 and "only admins can make this change" in refused[2]
    assert none[0] == 1 and "has no data endpoint" in none[2]


def test_the_dry_run_prints_each_data_input_with_its_size_and_where_it_is_cached() -> None:
    job = {
        "name": "train",
        "provider": "bash",
        "resources": {},
        "commands": ["python train.py"],
        "data_inputs": [
            {"uri": "s3://acme-data/imagenet/", "path": "imagenet", "file_count": 200, "total_size": 1898,
             "cached_on": ["local-1"]},
            {"uri": "https://example.com/vocab.txt", "path": "vocab.txt", "file_count": 1, "total_size": 5 << 20,
             "cached_on": []},
        ],
    }  # fmt: skip

    lines = plan_lines({"workflow": "train", "jobs": [job]})

    assert "   data: s3://acme-data/imagenet/ → imagenet: 200 files, 1.9 KiB; cached on idle machine local-1" in lines
    assert (
        "   data: https://example.com/vocab.txt → vocab.txt: 1 file, 5.0 MiB; not cached on any idle machine: downloaded"
        in lines
    )

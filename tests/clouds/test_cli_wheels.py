"""The CLI as the server serves it (``/cli/wheels/``): wheels of
``trainyard-cli`` and ``trainyard-spec`` written from the sources beside the
server, listed for ``--find-links`` and as a PEP 503 index for
``--extra-index-url``. The end-to-end install is tests/e2e/test_install_lines.py."""

from __future__ import annotations

import hashlib
import io
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack import REPO_ROOT

LINK = re.compile(r'href="([^"#]+)#sha256=([0-9a-f]{64})"')

pytestmark = pytest.mark.django_db


def _metadata(data: bytes) -> str:
    archive = zipfile.ZipFile(io.BytesIO(data))
    return archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()


def test_the_folder_lists_the_cli_and_the_spec_with_their_digests(client: Any) -> None:
    page = client.get("/cli/wheels/")
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    links = dict(LINK.findall(page.content.decode()))
    assert sorted(n.split("-", 1)[0] for n in links) == ["trainyard_cli", "trainyard_spec"]
    for name, digest in links.items():
        wheel = client.get(f"/cli/wheels/{name}")
        assert wheel.status_code == 200 and wheel["Content-Type"] == "application/octet-stream"
        assert hashlib.sha256(wheel.content).hexdigest() == digest


def test_the_cli_wheel_says_what_pip_needs_and_holds_the_whole_package(client: Any) -> None:
    project = client.get("/cli/wheels/trainyard-cli/").content.decode()
    ((name, _),) = LINK.findall(project)
    assert name.startswith("../trainyard_cli-0.1.0+g") and name.endswith("-py3-none-any.whl")
    data = client.get(f"/cli/wheels/{name.removeprefix('../')}").content
    metadata = _metadata(data)
    assert "Name: trainyard-cli\n" in metadata and "Requires-Python: >=3.11\n" in metadata
    assert "Requires-Dist: trainyard-spec==0.1.0\n" in metadata and "Requires-Dist: click==8.5.1\n" in metadata
    files = zipfile.ZipFile(io.BytesIO(data)).namelist()
    sources = {f"trainyard/{p.relative_to(REPO_ROOT / 'cli' / 'trainyard').as_posix()}" for p in
               (REPO_ROOT / "cli" / "trainyard").rglob("*.py") if "__pycache__" not in p.parts}  # fmt: skip
    assert sources <= set(files) and "trainyard/py.typed" in files
    assert not [f for f in files if f.endswith(".pyc")]
    entry_points = next(f for f in files if f.endswith(".dist-info/entry_points.txt"))
    assert b"trainyard = trainyard.console:main" in zipfile.ZipFile(io.BytesIO(data)).read(entry_points)


def test_a_project_the_server_does_not_serve_is_404_so_pip_looks_elsewhere(client: Any) -> None:
    assert client.get("/cli/wheels/Trainyard_Spec/").status_code == 200  # any spelling of the name
    assert client.get("/cli/wheels/click/").status_code == 404
    assert client.get("/cli/wheels/trainyard/").status_code == 404  # the name on PyPI that is someone else's
    assert client.get("/cli/wheels/nothing-1.0-py3-none-any.whl").status_code == 404
    assert client.get("/cli/wheels/%3Cscript%3E.whl").status_code == 404


def test_a_changed_source_is_served_under_a_new_version(settings: Any, tmp_path: Path, client: Any) -> None:
    for folder in ("cli", "spec"):
        shutil.copytree(
            REPO_ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
        )
    settings.BASE_DIR = tmp_path
    before = dict(LINK.findall(client.get("/cli/wheels/").content.decode()))
    (tmp_path / "cli" / "trainyard" / "extra.py").write_text("X = 1\n")
    after = dict(LINK.findall(client.get("/cli/wheels/").content.decode()))
    cli_before = next(n for n in before if n.startswith("trainyard_cli-"))
    cli_after = next(n for n in after if n.startswith("trainyard_cli-"))
    assert cli_before != cli_after
    assert [n for n in before if n.startswith("trainyard_spec-")] == [
        n for n in after if n.startswith("trainyard_spec-")
    ]


def test_without_the_sources_the_folder_answers_503_saying_so(settings: Any, tmp_path: Path, client: Any) -> None:
    settings.BASE_DIR = tmp_path
    answer = client.get("/cli/wheels/trainyard-cli/")
    assert answer.status_code == 503 and answer["Retry-After"] == "30"
    text = answer.content.decode()
    assert text.startswith(
        f"the CLI's wheels are not available: the sources of trainyard-cli are not beside this server ({tmp_path / 'cli'}"
    )
    assert "Traceback" not in text

"""The ``subject`` fixture: every backend in ``SUBJECTS``, one after the other.

Every test ends with nothing of ours left running: the fixture kills what is
left (runner processes under the test's directory, machines ``list_managed``
still sees) and then fails the test if there was anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.clouds.subjects import SUBJECTS, Subject
from tests.support.fixtures import *  # noqa: F403  (tenant fixtures for the scheduling tests)


@pytest.fixture(params=sorted(SUBJECTS))
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    made = SUBJECTS[request.param](name=request.param, root=tmp_path)
    if reason := made.skip_reason():
        pytest.skip(reason)
    if made.needs_moto:
        made.moto = request.getfixturevalue("aws")
    if made.needs_kube:
        made.kube = request.getfixturevalue("kube_api")
    made.start()
    yield made
    left = made.leftovers()
    assert left == [], f"the test left these running: {left}"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """The fake backend's script file (empty: everything works)."""
    path = tmp_path / "script.json"
    path.write_text("{}")
    return path


@pytest.fixture
def fake_account(team: Any, tmp_path: Path, script: Path, settings: Any) -> Iterator[Callable[..., Any]]:
    """Connects a fake account (state only) to ``team`` with the given offers,
    the local backend off; afterwards terminates its machines and asserts
    nothing of ours is left running."""
    from backend.clouds.models import CloudAccount, Instance
    from backend.clouds.services.accounts import compute_of
    from backend.clouds.services.provisioning import instance_terminate_run

    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False, "HEARTBEAT_TIMEOUT_SECONDS": 5.0}
    made: list[Any] = []

    def connect(offers: list[dict[str, Any]]) -> Any:
        config = {"state_dir": str(tmp_path / "state"), "script_file": str(script), "offers": offers}
        made.append(CloudAccount.objects.create(workspace=team, kind="fake", name="fake", config=config))
        return made[-1]

    yield connect
    for account in made:
        for instance in Instance.objects.filter(account=account):
            instance_terminate_run(instance_id=str(instance.pk))
        assert list(compute_of(account).list_managed()) == []

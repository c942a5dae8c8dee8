"""The ``subject`` fixture: every backend in ``SUBJECTS``, one after the other.

Every test ends with nothing of ours left running: the fixture kills what is
left (runner processes under the test's directory, machines ``list_managed``
still sees) and then fails the test if there was anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clouds.subjects import SUBJECTS, Subject
from tests.support.fixtures import *  # noqa: F403  (tenant fixtures for the scheduling tests)


@pytest.fixture(params=sorted(SUBJECTS))
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    made = SUBJECTS[request.param](name=request.param, root=tmp_path)
    yield made
    left = made.leftovers()
    assert left == [], f"the test left these running: {left}"
